"""Step ingest: classify groups, store them once, and maintain the per-step rows (DESIGN.md §3–§4).

One batch is one transaction: a validation error (422) stores nothing. Within an attempt a
group's key ``(run, attempt, step, split, rank, group_id)`` is immutable: the first write wins, an
identical re-send is a duplicate, a different one a conflict. The newest attempt that has sent a
(step, split) owns it; older attempts' groups are kept but not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import orjson
from sqlalchemy import bindparam, false, insert, select, union_all, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from vantage.client.acr import (
    STEP_METRIC_FIELDS,
    ACRSettings,
    StepAccumulator,
)
from vantage.client.schema import StepRecord, StepsBatch

from .alert_metrics import drop_stale_windows
from .classify import (
    INVALID,
    BadGroupStats,
    GroupColumns,
    classify_groups,
    classify_reward_lists,
)
from .group_blocks import decode_hashes, encode_arrays, encode_block
from .locks import SAVE_RUN_STATE, RunState, save_run_state
from .models import GroupBlock, Run, Step, utcnow
from .queries import point_json


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
class _StepDelta:
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
_CHUNK = 900  # steps a statement: within old SQLite's 999 parameters


def _earlier_blocks(
    session: Session, run_key: int, attempt: int, heads: list[tuple[int, str, int]]
) -> dict[tuple[int, str, int], _Earlier]:
    out: dict[tuple[int, str, int], _Earlier] = {}
    conn = session.connection()
    steps_of: dict[tuple[str, int], list[int]] = {}
    for step, split, rank in heads:
        steps_of.setdefault((split, rank), []).append(step)
    for (split, rank), steps in steps_of.items():
        for i in range(0, len(steps), _CHUNK):
            params = {"run_key": run_key, "attempt": attempt, "split": split, "rank": rank}
            params["steps"] = steps[i : i + _CHUNK]
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


def _deltas(classified: list[Classified]) -> dict[tuple[str, int], _StepDelta]:
    """What the batch adds to each (split, step): its records, and the groups it stored."""
    deltas: dict[tuple[str, int], _StepDelta] = {}
    for item in classified:
        rec, cols = item.record, item.columns
        d = deltas.setdefault((rec.split, rec.step), _StepDelta())
        _merge_record(d, rec)
        if len(item.stored) == len(cols.cls):
            cols.add_to(d.acc)
        elif item.stored:
            cols.add_to(d.acc, item.stored)
    return deltas


def _merge_record(d: _StepDelta, rec: StepRecord) -> None:
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


STEPS = Step.__table__  # ingest reads and writes step rows with Core: no unit-of-work overhead
STEP_COLUMNS = tuple(c.name for c in STEPS.columns if c.name != "id")
# Built once (a statement memoizes its cache key): the batch's step rows and every unevaluated
# step row of the run, in one read; their inserts and updates. Two branches, each with its own
# index (a row in both comes twice): with the two conditions ORed, PostgreSQL without table
# statistics planned, and for a prepared statement kept, a scan of every step of the run (300
# index entries a batch at step 300; 0.3 ms a batch, then 2.6 ms 1,700 steps later).
_READ_KEYS = select(STEPS).where(
    STEPS.c.run_id == bindparam("run_id"),
    STEPS.c.split == bindparam("split"),
    STEPS.c.step.in_(bindparam("steps", expanding=True)),
)
_READ_STEPS = union_all(
    _READ_KEYS,
    select(STEPS).where(STEPS.c.run_id == bindparam("run_id"), STEPS.c.evaluated == false()),
)
_INSERT_STEP = insert(STEPS)
# The run's newest training step below ``below`` that has an ACR, as stored: the caller leaves
# out the batch's steps that now have none (their stored rows are about to be replaced).
_NEWEST_MEASURED = (
    select(STEPS.c.step, STEPS.c.acr)
    .where(
        STEPS.c.run_id == bindparam("run_id"),
        STEPS.c.split == "train",
        STEPS.c.acr.is_not(None),
        STEPS.c.step < bindparam("below"),
        STEPS.c.step.not_in(bindparam("unmeasured", expanding=True)),
    )
    .order_by(STEPS.c.step.desc())
    .limit(1)
)
_UPDATE_STEP = update(STEPS).where(STEPS.c.id == bindparam("row_id"))


def _step_rows(
    session: Session, run: RunState, attempt: int, keys: list[tuple[str, int]]
) -> tuple[dict[tuple[str, int], SimpleNamespace], list[SimpleNamespace]]:
    """The step rows of ``keys`` (new ones made up, id None), and every unevaluated step row of
    the run, read together, as plain objects with the columns as attributes; nothing is read
    when the run has none of them (`_all_new`). The caller holds the run's lock
    (`vantage.server.locks.run_lock`), so no other writer touches them; it writes them back
    with `StepWrites`."""
    by_id = {} if _all_new(run, keys) else _read_step_rows(session, run.id, keys)
    wanted = set(keys)
    out = {(r.split, r.step): r for r in by_id.values() if (r.split, r.step) in wanted}
    unevaluated = {r.id: r for r in by_id.values() if not r.evaluated}
    now = utcnow()
    for split, step in keys:
        if (split, step) not in out:
            out[(split, step)] = _new_step_row(run, split, step, attempt, now)
    return out, list(unevaluated.values())


def _read_step_rows(
    session: Session, run_id: str, keys: list[tuple[str, int]]
) -> dict[int, SimpleNamespace]:
    """The stored rows of ``keys`` and every unevaluated row of the run, by id."""
    by_id: dict[int, SimpleNamespace] = {}  # a row read twice is one object
    conn = session.connection()
    steps_of: dict[str, list[int]] = {}
    for split, step in keys:
        steps_of.setdefault(split, []).append(step)
    statement = _READ_STEPS  # the first read also reads the unevaluated rows
    for split, steps in steps_of.items():
        for i in range(0, len(steps), _CHUNK):
            params = {"run_id": run_id, "split": split, "steps": steps[i : i + _CHUNK]}
            for mapping in conn.execute(statement, params).mappings():
                if mapping["id"] not in by_id:
                    by_id[mapping["id"]] = SimpleNamespace(**mapping)
            statement = _READ_KEYS
    return by_id


def _new_step_row(run: RunState, split: str, step: int, attempt: int, now: Any) -> SimpleNamespace:
    row = SimpleNamespace(**{c.name: None for c in STEPS.columns})
    row.run_id, row.split, row.step, row.attempt = run.id, split, step, attempt
    row.first_seen_at = row.updated_at = now
    row.world_size, row.evaluated = run.world_size, False
    row.ranks, row.acc, row.effective_by_rank, row.scalars = [], {}, {}, {}
    return row


class StepWrites:
    """The writes of a batch's step rows (inserting new ones) and of any unevaluated row that
    alert evaluation has flagged: done once, by `flush` (alert evaluation calls it before it
    reads steps) or by `save_steps_and_run` with the run's state."""

    def __init__(self, session: Session, result: IngestResult) -> None:
        self.session, self.result = session, result
        self.done = False
        self._rows: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None

    def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The parameters of the rows to insert and of those to update, made on the first call
        (make it once the evaluated flags are final)."""
        if self._rows is None:
            result = self.result
            rows = [*result.step_rows, *(r for r in result.older_unevaluated if r.evaluated)]
            for r in result.step_rows:
                r.point = point_json(r)
            new = [{c: getattr(r, c) for c in STEP_COLUMNS} for r in rows if r.id is None]
            old = [
                {"row_id": r.id, **{c: getattr(r, c) for c in STEP_COLUMNS}} for r in rows if r.id
            ]
            self._rows = new, old
        return self._rows

    def flush(self) -> None:
        """Write the rows now, one statement for each kind (nothing when done already)."""
        if self.done:
            return
        self.done = True
        new, old = self.rows()
        conn = self.session.connection()
        if new:
            conn.execute(_INSERT_STEP, new)
        if old:
            conn.execute(_UPDATE_STEP, old)


# PostgreSQL: one new step row and the run's state in one statement (a data-modifying CTE),
# the common end of an ingest transaction: a round trip fewer under the run's lock.
_SAVE_WITH_STEP = SAVE_RUN_STATE.add_cte(
    insert(STEPS)
    .values({c: bindparam(f"step_{c}", type_=STEPS.c[c].type) for c in STEP_COLUMNS})
    .cte("new_step")
)


def save_steps_and_run(session: Session, run: RunState, writes: StepWrites) -> None:
    """Write the batch's step rows, unless alert evaluation did (`StepWrites.flush`), and the
    run's state (`save_run_state`); on PostgreSQL a single new row goes in the same statement.
    The caller holds the run's lock and commits."""
    if not writes.done and session.get_bind().dialect.name == "postgresql":
        new, old = writes.rows()
        if len(new) == 1 and not old:
            writes.done = True
            step = {f"step_{c}": v for c, v in new[0].items()}
            save_run_state(session, run, _SAVE_WITH_STEP, step)
            return
    writes.flush()
    save_run_state(session, run)


def _accumulator(data: dict[str, Any]) -> StepAccumulator:
    acc = StepAccumulator()
    for k, v in data.items():
        if k == "group_sizes":
            acc.group_sizes = {int(size): count for size, count in v.items()}
        elif k == "reward_sum":
            acc.reward_sum = load_exact(v)
        elif hasattr(acc, k):
            setattr(acc, k, v)
    return acc


def _dump_accumulator(acc: StepAccumulator) -> dict[str, Any]:
    out = {k: getattr(acc, k) for k in acc.__slots__}  # type: ignore[attr-defined]
    out["group_sizes"] = {str(k): v for k, v in acc.group_sizes.items()}
    out["reward_sum"] = dump_exact(acc.reward_sum)  # JSON numbers would round it
    return out


def dump_exact(value: int) -> str:
    """An exact big integer as short text: ``"m<<e"``, its odd part m and the power of two e.
    The fixed-point reward sums of `StepAccumulator` carry about 1,100 bits, nearly all trailing
    zeros: 330 decimal digits, a quarter of a step row, for a sum of a few rewards."""
    if value == 0:
        return "0"
    shift = (value & -value).bit_length() - 1
    return f"{value >> shift}<<{shift}"


def load_exact(text: str) -> int:
    """The integer `dump_exact` wrote, or a plain decimal (rows written before it)."""
    odd, _, shift = text.partition("<<")
    return int(odd) << int(shift) if shift else int(odd)


def _apply_delta(row: Any, attempt: int, d: _StepDelta, run: RunState) -> bool:
    """Add a batch's delta to a step row it may own; returns False when a newer attempt owns it."""
    fresh = not row.acc
    if row.attempt > attempt and not fresh:
        return False
    if row.attempt < attempt or fresh:  # a newer attempt takes the step over
        row.attempt = attempt
        row.acc, row.ranks, row.effective_by_rank, row.scalars = {}, [], {}, {}
        row.mitigation, row.time, row.evaluated = None, None, False
        row.first_seen_at = utcnow()
    acc = _accumulator(row.acc)
    acc.merge(d.acc)
    effective = dict(row.effective_by_rank)
    for rank, (n_valid, n_zero) in d.effective.items():
        effective.setdefault(rank, [n_valid, n_zero])
    acc.eff_n_valid = sum(v[0] for v in effective.values())
    acc.eff_n_zero_advantage = sum(v[1] for v in effective.values())
    acc.eff_reports = len(effective)
    row.acc = _dump_accumulator(acc)
    row.effective_by_rank = effective
    row.ranks = sorted(set(row.ranks) | d.ranks)
    row.scalars = {**row.scalars, **d.scalars}
    if d.mitigation is not None:
        row.mitigation = d.mitigation
    row.world_size = d.world_size or row.world_size or run.world_size
    row.time = row.time if row.time is not None else d.time
    row.updated_at = utcnow()
    for name, value in acc.metrics().items():
        setattr(row, name, value)
    return True


def store_batch(
    session: Session,
    run: RunState,
    batch: StepsBatch,
    classified: list[Classified],
    result: IngestResult,
    groups_stored: bool = False,
) -> None:
    """Store a classified batch's new groups (unless ``groups_stored``: `store_groups` ran
    before the lock) and add them to their step rows and the run's latest state. The caller
    holds the run's lock and commits; step rows are left unwritten, so that alert evaluation
    adds its flags to the same writes (`write_step_rows`). Raises UnknownAttemptError (409)."""
    if batch.attempt > run.attempt:
        raise UnknownAttemptError(
            f"attempt {batch.attempt} is unknown for run {run.id} (latest is {run.attempt}); "
            "POST /api/v1/runs first to register the launch"
        )
    result.has_rank0 = any(r.rank == 0 for r in batch.records)
    if not batch.records:
        return
    keys = sorted({(rec.split, rec.step) for rec in batch.records})
    step_rows, unevaluated = _step_rows(session, run, batch.attempt, keys)
    if not groups_stored:
        stored_steps = {k for k, row in step_rows.items() if row.id is not None}
        store_groups(session, run.key, batch.attempt, classified, result, stored_steps)
    deltas = _deltas(classified)
    touched_rows: list[SimpleNamespace] = []
    moved: list[tuple[str, int]] = []  # steps whose window inputs changed
    for key in keys:
        row = step_rows[key]
        before = _window_inputs(row)
        if _apply_delta(row, batch.attempt, deltas[key], run):
            touched_rows.append(row)
            if _window_inputs(row) != before:
                moved.append(key)
        result.steps.append(step_answer(row))
        result.touched.append(key)
    _update_run_state(session, run, touched_rows, batch)
    run.newest_steps = _newest_steps(run.newest_steps, keys)
    run.eval_progress = drop_stale_windows(run.eval_progress, moved)
    result.step_rows = list(step_rows.values())
    result.older_unevaluated = [r for r in unevaluated if (r.split, r.step) not in step_rows]
    result.candidates = [r for r in result.step_rows if not r.evaluated]
    result.candidates += result.older_unevaluated


def _all_new(run: RunState, keys: list[tuple[str, int]]) -> bool:
    """Whether the run has no step row of any of ``keys`` (split, step), nor an unevaluated
    one: then `_step_rows` would read nothing, and is skipped. The run's `newest_steps` and
    `has_unevaluated`, read under its lock, tell; ingest is the only writer of step rows, and
    keeps them (`_newest_steps`, `note_unevaluated`)."""
    newest = run.newest_steps
    if run.has_unevaluated or newest is None:
        return False
    return all(split not in newest or step > newest[split] for split, step in keys)


def _newest_steps(newest: dict[str, int] | None, keys: list[tuple[str, int]]) -> dict | None:
    """The run's `newest_steps` once rows of ``keys`` exist (None stays: not known)."""
    if newest is None:
        return None
    out = dict(newest)
    for split, step in keys:
        out[split] = max(step, out.get(split, step))
    return out


def note_unevaluated(run: RunState, result: IngestResult) -> None:
    """Set the run's `has_unevaluated` from what the batch's transaction left unevaluated: the
    batch's step rows and the run's other unevaluated ones, which `store_batch` read (or knew
    there were none) for a batch with records. Call after alert evaluation flagged the rows it
    took."""
    if result.touched:
        rows = (*result.step_rows, *result.older_unevaluated)
        run.has_unevaluated = any(not r.evaluated for r in rows)


def _window_inputs(row: Any) -> tuple:
    """What a step adds to the window metrics (`vantage.server.alert_metrics.Window`)."""
    return row.acr, row.n_collapsed, row.n_valid, row.reward_mean


def _update_run_state(session: Session, run: RunState, rows: list[Any], batch: StepsBatch) -> None:
    run.last_seen_at = utcnow()
    train = [r for r in rows if r.split == "train"]
    newest_step = max((r.step for r in train), default=None)
    if newest_step is not None and (run.last_step is None or newest_step >= run.last_step):
        run.last_step = newest_step
    # The ACR of the run's newest step that has one: a step with no valid group (scalars
    # only, or every group invalid) keeps the ACR last known, also when it comes in one batch
    # with the step before it, and a late rank's groups for that step still update it (the
    # runs list showed none, or an older step's: trials). A newer attempt that takes that step
    # over without an ACR hands it to the newest step below that has one (the runs list kept
    # the replaced ACR: a trial).
    if any(r.step == run.latest_acr_step and r.acr is None for r in train):
        unmeasured = [r.step for r in train if r.acr is None]
        found = session.connection().execute(
            _NEWEST_MEASURED,
            {"run_id": run.id, "below": run.latest_acr_step, "unmeasured": unmeasured},
        )
        run.latest_acr_step, run.latest_acr = found.one_or_none() or (None, None)
    measured = [r for r in train if r.acr is not None]
    if measured:
        newest = max(measured, key=lambda r: r.step)
        if run.latest_acr_step is None or newest.step >= run.latest_acr_step:
            run.latest_acr, run.latest_acr_step = newest.acr, newest.step
    for rec in batch.records:
        if rec.mitigation is not None:
            run.mitigation_reported = rec.mitigation


def step_answer(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"step": row.step, "split": row.split, "attempt": row.attempt}
    for name in STEP_METRIC_FIELDS:
        out[name] = getattr(row, name)
    return out
