"""A batch's groups: classified against the run's settings and stored once, as one block per
record (`group_blocks`); the first write of a group's key wins (docs/design.md §3)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import bindparam, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from vantage.client.acr import (
    ACRSettings,
    StepAccumulator,
)
from vantage.client.schema import StepRecord, StepsBatch

from ..classify import (
    INVALID,
    BadGroupStats,
    GroupColumns,
    classify_groups,
    classify_reward_lists,
)
from ..group_blocks import decode_hashes, encode_arrays, encode_block
from ..locks import RunState
from ..models import GroupBlock, Run
from ..reward_shape import add_reward_shape


class IngestError(ValueError):
    """A batch that cannot be stored as sent (answered 422, nothing stored); ``detail`` lists
    the errors as pydantic's validation errors do (type, loc, msg)."""

    def __init__(self, detail: list[dict]) -> None:
        super().__init__("; ".join(e["msg"] for e in detail))
        self.detail = detail


class UnknownAttemptError(ValueError):
    """The batch names an attempt the run does not have."""


class GroupsExist(RuntimeError):
    """Another transaction stored blocks of the same (step, split, rank) while this one stored
    its own: redo the transaction, which then reads them."""


@dataclass(slots=True)
class StepDelta:
    """What one batch adds to one (split, step)."""

    acc: StepAccumulator = field(default_factory=StepAccumulator)
    ranks: set[int] = field(default_factory=set)
    effective: dict[str, list[int]] = field(default_factory=dict)
    scalars: dict[str, float | str | None] = field(default_factory=dict)
    mitigation: dict[str, Any] | None = None
    world_size: int | None = None
    time: float | None = None


@dataclass(slots=True)
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    invalid_groups: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    touched: list[tuple[str, int]] = field(default_factory=list)
    has_rank0: bool = False
    # The batch's step rows and the run's other unevaluated ones (to write back), and the
    # unevaluated ones among both, for alert evaluation.
    step_rows: list[Any] = field(default_factory=list)
    older_unevaluated: list[Any] = field(default_factory=list)
    candidates: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What storing a run's groups needs before its lock: fields fixed when the run is created,
    so a process may keep them (`run_info`); ingest compares them with the locked row."""

    key: int
    project: str | None
    settings: ACRSettings

    @classmethod
    def of(cls, run: Run | RunState) -> RunInfo:
        settings = ACRSettings(
            reward_min=run.reward_min, reward_max=run.reward_max, trainer_eps=run.trainer_eps
        )
        return cls(run.key, run.project, settings)


_RUN_INFO: dict[str, RunInfo] = {}
_RUN_INFO_MAX = 10_000


def run_info(session: Session, run_id: str) -> RunInfo | None:
    """The run's fixed fields, from this process's cache or the database (None: no such run).
    A run deleted and created again under the same id is caught by the check under the lock."""
    info = _RUN_INFO.get(run_id)
    if info is None:
        run = session.get(Run, run_id)
        if run is None:
            return None
        if len(_RUN_INFO) >= _RUN_INFO_MAX:
            _RUN_INFO.clear()
        info = _RUN_INFO[run_id] = RunInfo.of(run)
    return info


def forget_run(run_id: str) -> None:
    """Drop a run's cached fields (it was deleted, or they no longer match)."""
    _RUN_INFO.pop(run_id, None)


@dataclass(slots=True)
class Classified:
    """One record's groups, classified: ``owned`` are those whose key first appears in the
    batch, ``stored`` those of them that `store_groups` found new and stored."""

    record: StepRecord
    columns: GroupColumns
    owned: list[int]
    stored: list[int] = field(default_factory=list)


def classify_batch(info: RunInfo, batch: StepsBatch, result: IngestResult) -> list[Classified]:
    """Classify every record's groups (no database needed: callers do it before taking the
    run's lock). Counts invalid groups, and a key repeated within the batch as a duplicate or a
    conflict, into ``result``. Raises IngestError (422) for impossible compact statistics."""
    settings = info.settings
    seen: dict[tuple, dict[str, int]] = {}
    out = []
    for ri, rec in enumerate(batch.records):
        try:
            lists = rec.reward_lists()
            if lists is not None:
                cols = classify_reward_lists(lists, settings, lazy=True)
            else:
                cols = classify_groups(rec.normal_groups(), settings)
        except BadGroupStats as exc:
            raise IngestError(exc.detail("body", "records", ri)) from exc
        owned = _first_in_batch(seen, rec, cols, result)
        if len(owned) == len(cols.cls):
            result.invalid_groups += cols.cls.count(INVALID)
        else:
            result.invalid_groups += sum(cols.cls[i] == INVALID for i in owned)
        out.append(Classified(rec, cols, owned))
    return out


def _first_in_batch(
    seen: dict[tuple, dict[str, int]], rec: StepRecord, cols: GroupColumns, result: IngestResult
) -> list[int]:
    """The indices of the record's groups whose key is new to the batch; ``seen`` holds the
    content hashes of the batch's groups by (step, split, rank), then group id."""
    head = (rec.step, rec.split, rec.rank)
    earlier = seen.get(head)
    if earlier is None:
        hashes = dict(zip(cols.group_ids, cols.hash, strict=True))
        if len(hashes) == len(cols.group_ids):  # the common case: every key is new
            seen[head] = hashes
            return list(range(len(hashes)))
        earlier = seen[head] = {}
    return _new_keys(earlier, cols, range(len(cols.group_ids)), result)


def _new_keys(
    known: dict[str, int], cols: GroupColumns, indices: Iterable[int], result: IngestResult
) -> list[int]:
    """Those of ``indices`` whose group id is not in ``known`` (id -> content hash), which
    they join; the others count as duplicates (same content hash) or conflicts."""
    new = []
    for i in indices:
        gid, content = cols.group_ids[i], cols.hash[i]
        prior = known.get(gid)
        if prior is None:
            known[gid] = content
            new.append(i)
        elif prior == content:
            result.duplicates += 1
        else:
            result.conflicts += 1
    return new


@dataclass(slots=True)
class _Earlier:
    """What a (step, split, rank) of the attempt stored before: its groups' content hashes by
    id, and the number its next block takes."""

    hashes: dict[str, int] = field(default_factory=dict)
    next_block: int = 0


BLOCKS = GroupBlock.__table__
_INSERT_BLOCK = insert(BLOCKS)
# The steps of one (split, rank) as a list: an index lookup per step, where a list of
# (step, split, rank) rows was a filter on every block of the attempt (PostgreSQL: 1.8 s for a
# batch of 10,000 steps; steps read in the same way below took 4.5 s).
_EARLIER_BLOCKS = select(
    BLOCKS.c.step,
    BLOCKS.c.split,
    BLOCKS.c.rank,
    BLOCKS.c.block,
    BLOCKS.c.group_ids,
    BLOCKS.c.hashes,
).where(
    BLOCKS.c.run_key == bindparam("run_key"),
    BLOCKS.c.attempt == bindparam("attempt"),
    BLOCKS.c.split == bindparam("split"),
    BLOCKS.c.rank == bindparam("rank"),
    BLOCKS.c.step.in_(bindparam("steps", expanding=True)),
)
CHUNK = 900  # steps a statement: within old SQLite's 999 parameters


def _earlier_blocks(
    session: Session, run_key: int, attempt: int, heads: list[tuple[int, str, int]]
) -> dict[tuple[int, str, int], _Earlier]:
    out: dict[tuple[int, str, int], _Earlier] = {}
    conn = session.connection()
    steps_of: dict[tuple[str, int], list[int]] = {}
    for step, split, rank in heads:
        steps_of.setdefault((split, rank), []).append(step)
    for (split, rank), steps in steps_of.items():
        for i in range(0, len(steps), CHUNK):
            params = {"run_key": run_key, "attempt": attempt, "split": split, "rank": rank}
            params["steps"] = steps[i : i + CHUNK]
            for step, split_, rank_, block, ids, hashes in conn.execute(_EARLIER_BLOCKS, params):
                earlier = out.setdefault((step, split_, rank_), _Earlier())
                earlier.hashes.update(zip(orjson.loads(ids), decode_hashes(hashes), strict=True))
                earlier.next_block = max(earlier.next_block, block + 1)
    return out


def store_groups(
    session: Session,
    run_key: int,
    attempt: int,
    classified: list[Classified],
    result: IngestResult,
    stored_steps: set[tuple[str, int]] | None = None,
) -> None:
    """Store each record's owned groups that its (step, split, rank) has not stored before in
    this attempt, as one block; sets each item's ``stored`` and counts accepted groups,
    duplicates and conflicts into ``result``.

    Under the run's lock, ``stored_steps`` names the (split, step)s that have a step row, and
    earlier blocks are read only for those: a step without a row has no groups in any attempt,
    since groups are only stored with their step's row. Without the lock (``stored_steps``
    None, PostgreSQL), each key's first block is inserted unless the key has one
    (`_insert_first_blocks`), and only the keys that had one read their earlier blocks; the
    primary key arbitrates: two transactions that both add a key's next block collide, and the
    later one raises GroupsExist when the first commits."""
    if stored_steps is None and len(classified) <= FIRST_BLOCKS_MAX:
        classified = _insert_first_blocks(session, run_key, attempt, classified, result)
    heads = {_head(c) for c in classified if c.owned}
    known = heads if stored_steps is None else [h for h in heads if (h[1], h[0]) in stored_steps]
    earlier = _earlier_blocks(session, run_key, attempt, sorted(known)) if known else {}
    rows = []
    for item in classified:
        before = earlier.setdefault(_head(item), _Earlier())
        item.stored = (
            _new_keys(before.hashes, item.columns, item.owned, result)
            if before.hashes
            else item.owned
        )
        if item.stored:
            rows.append(_block_row(run_key, attempt, item, before.next_block))
            before.next_block += 1
        result.accepted += len(item.stored)
    if not rows:
        return
    # In key order: two transactions inserting blocks of the same keys wait for each other in
    # the same order, never in a cycle.
    rows.sort(key=lambda r: (r["step"], r["split"], r["rank"], r["block"]))
    try:
        session.connection().execute(_INSERT_BLOCK, rows)
    except IntegrityError as exc:
        raise GroupsExist(str(exc.orig)) from exc


# Records of a batch for which `store_groups` tries first blocks before reading earlier ones:
# a batch of many steps is more often a replay (a spool, `vantage sync`) whose keys have blocks,
# and 10,000 first blocks that all existed took 2.4 s to refuse (PostgreSQL).
FIRST_BLOCKS_MAX = 64
# A key's first block, unless the key has one (committed, or committed meanwhile by a
# transaction this one waited for); answers the keys it stored.
_INSERT_FIRST_BLOCK = (
    pg_insert(BLOCKS)
    .on_conflict_do_nothing()
    .returning(BLOCKS.c.step, BLOCKS.c.split, BLOCKS.c.rank)
)


def _insert_first_blocks(
    session: Session,
    run_key: int,
    attempt: int,
    classified: list[Classified],
    result: IngestResult,
) -> list[Classified]:
    """PostgreSQL, before the run's lock: store each record's owned groups as its key's block 0
    in one statement, when that key has no block yet (nearly always: a rank sends a step's
    groups once), which saves reading the keys' earlier blocks first. Returns the records left
    to `store_groups`' general path: those of keys that had blocks, and every record of a key
    that several records of the batch share (their blocks are numbered in turn there)."""
    by_head: dict[tuple[int, str, int], list[Classified]] = {}
    for item in classified:
        if item.owned:
            by_head.setdefault(_head(item), []).append(item)
    alone = {head: items[0] for head, items in by_head.items() if len(items) == 1}
    for item in alone.values():
        item.stored = item.owned
    # in key order, as `store_groups`
    rows = [_block_row(run_key, attempt, item, 0) for _, item in sorted(alone.items())]
    stored = set()
    if rows:
        stored = {tuple(r) for r in session.connection().execute(_INSERT_FIRST_BLOCK, rows)}
    result.accepted += sum(len(alone[head].owned) for head in stored)
    return [item for head, items in by_head.items() if head not in stored for item in items]


def _head(item: Classified) -> tuple[int, str, int]:
    """A record's key without the run and attempt: (step, split, rank)."""
    return item.record.step, item.record.split, item.record.rank


def _block_row(run_key: int, attempt: int, item: Classified, number: int) -> dict[str, Any]:
    """The row of `group_blocks` that holds ``item.stored`` as block ``number`` of its key."""
    step, split, rank = _head(item)
    row = {"run_key": run_key, "attempt": attempt, "step": step, "split": split, "rank": rank}
    return row | {"block": number} | _encode(item.columns, item.stored)


_BLOCK_FIELDS = ("group_ids", "prompt_ids", "cls", "side", "n", "mean", "std", "min", "max")
_BLOCK_FIELDS += ("n_pass", "hash")


def _encode(cols: GroupColumns, indices: list[int]) -> dict:
    whole = len(indices) == len(cols.cls)
    if whole and cols.arrays is not None:  # from the arrays classification left (common)
        return encode_arrays(
            cols.group_ids, cols.prompt_ids, cols.hash, *cols.arrays.block_values()
        )
    columns = [getattr(cols.filled(), name) for name in _BLOCK_FIELDS]
    if not whole:
        columns = [[column[i] for i in indices] for column in columns]
    return encode_block(*columns)


def step_deltas(
    classified: list[Classified], settings: ACRSettings
) -> dict[tuple[str, int], StepDelta]:
    """What the batch adds to each (split, step): its records, and the groups it stored (their
    classes and their reward shape, `add_reward_shape`, under the run's ``settings``)."""
    deltas: dict[tuple[str, int], StepDelta] = {}
    for item in classified:
        rec, cols = item.record, item.columns
        d = deltas.setdefault((rec.split, rec.step), StepDelta())
        _merge_record(d, rec)
        if len(item.stored) == len(cols.cls):
            cols.add_to(d.acc)
            add_reward_shape(d.acc, rec, cols, None, settings)
        elif item.stored:
            cols.add_to(d.acc, item.stored)
            add_reward_shape(d.acc, rec, cols, item.stored, settings)
    return deltas


def _merge_record(d: StepDelta, rec: StepRecord) -> None:
    d.ranks.add(rec.rank)
    if rec.effective is not None:
        d.effective.setdefault(
            str(rec.rank), [rec.effective.n_valid, rec.effective.n_zero_advantage]
        )
    d.scalars.update(rec.storable_scalars())
    if rec.mitigation is not None:
        d.mitigation = rec.mitigation
    if rec.world_size is not None:
        d.world_size = rec.world_size
    if rec.time is not None and d.time is None:
        d.time = rec.time
