"""A batch's step rows: what its groups add to each (split, step), the newest attempt's view,
and the run's latest state, written with Core in as few statements as possible."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sqlalchemy import bindparam, false, insert, select, union_all, update
from sqlalchemy.orm import Session
from vantage.client.acr import (
    STEP_METRIC_FIELDS,
    ACRSettings,
    StepAccumulator,
)
from vantage.client.schema import StepsBatch

from ..alerts.metrics import drop_stale_windows
from ..locks import SAVE_RUN_STATE, RunState, save_run_state
from ..models import Step, utcnow
from ..queries import point_json
from .groups import (
    CHUNK,
    Classified,
    IngestResult,
    StepDelta,
    UnknownAttemptError,
    step_deltas,
    store_groups,
)

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
        for i in range(0, len(steps), CHUNK):
            params = {"run_id": run_id, "split": split, "steps": steps[i : i + CHUNK]}
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
    # power sums (shape_s1...) stored before the moments: their counts would read as no spread
    legacy = "shape_s1" in data
    for k, v in data.items():
        if legacy and k.startswith("shape_"):
            continue
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


def _apply_delta(row: Any, attempt: int, d: StepDelta, run: RunState) -> bool:
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
    settings = ACRSettings(reward_min=run.reward_min, reward_max=run.reward_max)
    deltas = step_deltas(classified, settings)
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
    """What a step adds to the window metrics (`vantage.server.alerts.metrics.Window`)."""
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
    # runs list showed none, or an older step's). A newer attempt that takes that step
    # over without an ACR hands it to the newest step below that has one (the runs list kept
    # the replaced ACR).
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
