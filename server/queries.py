"""Read-side functions shared by the API routes and the dashboard. Each takes a session and
returns JSON-able values shaped like the API answers of docs/design.md §4. None reads per-group data
except `run_prompts`."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from operator import itemgetter
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
from sqlalchemy import BigInteger, String, bindparam, cast, func, literal, literal_column, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session
from sqlalchemy.types import NullType
from vantage.client.acr import DEFAULT_STREAK_THRESHOLD, STEP_METRIC_FIELDS, window_metrics
from vantage.client.schema import NON_FINITE_TOKENS

from .alerts.listing import list_alerts
from .classify import COLLAPSED
from .commands import command_dict, mitigation_state
from .commands import list_commands as list_commands  # re-exported for the dashboard
from .group_blocks import decode_block
from .models import (
    ACR_ABSENT,
    EMA_TAIL,
    SERIES_SLOTS,
    Command,
    GroupBlock,
    Run,
    Step,
    StepSeries,
    as_utc,
    iso,
)
from .run_health import attach_health

DEFAULT_MAX_POINTS = 5000
POINT_COLUMNS = ("step", "attempt", "time", *STEP_METRIC_FIELDS)


def run_status(run: Run, now: datetime | None = None) -> str:
    """running / stale / finished / failed; stale when nothing arrived for 3 × heartbeat_s."""
    if run.status != "running":
        return run.status
    now = now or datetime.now(UTC)
    seen = as_utc(run.last_seen_at)
    if now - seen > timedelta(seconds=3 * run.heartbeat_s):
        return "stale"
    return "running"


def client_health(run: Run) -> dict[str, int]:
    totals = {"spooled_groups": 0, "dropped_groups": 0, "dead_letter_batches": 0}
    for per_rank in (run.client_health or {}).values():
        for k in totals:
            totals[k] += int(per_rank.get(k) or 0)
    return totals


def run_dict(run: Run, mitigation: dict[str, Any] | None = None) -> dict[str, Any]:
    mitigation = mitigation or {"requested": None, "applied": None}
    return {
        "run_id": run.id,
        "name": run.name,
        "project": run.project,
        "tags": run.tags or [],
        "notes": run.notes,
        "config": run.config,
        "status": run_status(run),
        "attempt": run.attempt,
        "reward_min": run.reward_min,
        "reward_max": run.reward_max,
        "group_size": run.group_size,
        "trainer_eps": run.trainer_eps,
        "world_size": run.world_size,
        "heartbeat_s": run.heartbeat_s,
        "mitigation_mode": run.mitigation_mode,
        "mitigation_requested": mitigation["requested"],
        "mitigation_applied": mitigation["applied"],
        "mitigation_reported": run.mitigation_reported,
        "last_step": run.last_step,
        "latest_acr": run.latest_acr,
        "latest_acr_step": run.latest_acr_step,
        "created_at": iso(run.created_at),
        "last_seen_at": iso(run.last_seen_at),
        "finished_at": iso(run.finished_at),
        "client": client_health(run),
    }


def list_runs(
    session: Session, project: str | None = None, tag: str | None = None
) -> list[dict[str, Any]]:
    """Every run, newest first, optionally filtered by project and tag."""
    q = select(Run).order_by(Run.created_at.desc())
    if project is not None:
        q = q.where(Run.project == project)
    runs = [r for r in session.scalars(q) if tag is None or tag in (r.tags or [])]
    states = mitigation_state(session, [r.id for r in runs])
    return [run_dict(r, states[r.id]) for r in runs]


def get_run(session: Session, run_id: str) -> dict[str, Any] | None:
    """The run as `GET /runs/{id}` answers it (with its ``health``), or None."""
    run = session.get(Run, run_id)
    if run is None:
        return None
    return attach_health(session, [run_dict(run, mitigation_state(session, [run_id])[run_id])])[0]


def _downsample(
    steps: np.ndarray | list[int], acrs: np.ndarray | list[float | None], max_points: int
) -> list[int]:
    """Steps to keep (in step order): each bucket's lowest and highest acr, so spikes survive,
    and from 3 points on the newest step (a live chart ends where the run is); at most
    ``max_points``. ``steps``: ascending int64 (n,); ``acrs``: float64 (n,), NaN or None for
    a null acr."""
    s = np.asarray(steps, dtype=np.int64)
    if len(s) <= max_points:
        return s.tolist()
    a = np.array(acrs, dtype=np.float64)  # None -> NaN
    if max_points >= 3:
        return [*_extremes(s[:-1], a[:-1], max_points - 1), int(s[-1])]
    return _extremes(s, a, max_points)


def _extremes(steps: np.ndarray, acrs: np.ndarray, max_points: int) -> list[int]:
    """Each of max_points // 2 buckets' lowest and highest acr (one point for max_points 1):
    bucket b holds positions [b·n // B, (b+1)·n // B) of the n steps (int64, ascending; acrs
    float64, NaN for null, which is never chosen over a number); ties go to the earliest step
    for the lowest and to the latest for the highest, so that a bucket of one value keeps its
    two ends (a run whose ACR stayed flat got half its max_points). Vectorised: a
    Python loop over 2,500 buckets of a 20,000-step run took 8-16 ms."""
    n = len(steps)
    if n <= max_points:
        return steps.tolist()
    null = np.isnan(acrs)
    low, high = np.where(null, np.inf, acrs), np.where(null, -np.inf, acrs)
    if max_points == 1:
        return [int(steps[np.argmax(high)])]
    buckets = max_points // 2  # n > max_points, so no bucket is empty
    starts = np.arange(buckets) * n // buckets
    bucket = np.repeat(np.arange(buckets), np.diff(starts, append=n))
    lo = _hits(low == np.minimum.reduceat(low, starts)[bucket], bucket)
    hi = _hits(high == np.maximum.reduceat(high, starts)[bucket], bucket, last=True)
    first, last = np.minimum(lo, hi), np.maximum(lo, hi)
    kept = np.stack([first, last], axis=1).ravel()
    keep = np.ones(kept.size, dtype=bool)
    keep[1::2] = last != first  # one point where a bucket's extremes are the same step
    return steps[kept[keep]].tolist()


def _hits(hit: np.ndarray, bucket: np.ndarray, last: bool = False) -> np.ndarray:
    """The first (``last``: the last) position of each bucket where ``hit`` holds (every bucket
    has one)."""
    positions = np.flatnonzero(hit)
    if last:
        positions = positions[::-1]
    return positions[np.unique(bucket[positions], return_index=True)[1]]


def _raw_rows(session: Session, statement: Any, unprepared: bool = False) -> list[tuple]:
    """Plain DBAPI tuples for a Core select: 100k-row scans skip SQLAlchemy's row objects.
    ``unprepared``: never as a prepared statement (psycopg prepares one that a connection runs
    five times, and PostgreSQL may then plan it without the parameters' values)."""
    conn = session.connection()
    compiled = statement.compile(conn)
    dbapi = conn.connection
    # psycopg's binary format parses numbers faster than text (SQLite has no such option)
    binary = conn.dialect.name == "postgresql"
    cursor = dbapi.cursor(binary=True) if binary else dbapi.cursor()
    params = (
        [compiled.params[k] for k in compiled.positiontup]
        if compiled.positiontup is not None
        else compiled.params
    )
    try:
        if binary:
            cursor.execute(str(compiled), params, prepare=False if unprepared else None)
        else:
            cursor.execute(str(compiled), params)
        return cursor.fetchall()
    except conn.dialect.loaded_dbapi.DataError as exc:  # a value the database refuses: 422
        raise DataError(str(compiled), params, exc) from exc
    finally:
        cursor.close()


def _rows_at_steps(
    session: Session, cols: list[Any], run_id: str, split: str, steps: list[int]
) -> list[tuple]:
    """Rows of the given steps, in step order (plain tuples); ``cols[0]`` must be Step.step."""
    if not steps:
        return []
    base = select(*cols).where(Step.run_id == run_id, Step.split == split)
    if session.get_bind().dialect.name == "postgresql":  # one query with an array parameter
        # ordered here: PostgreSQL's sort of 5,000 wide rows took 3 of a 13 ms read. The range
        # bounds the index scan: on a table without statistics (autovacuum off) PostgreSQL took
        # the array as a filter on every step of the split (10 ms for one of 20,000 steps).
        within = Step.step.between(min(steps), max(steps))
        found = _raw_rows(session, base.where(within, steps_in_array(steps)), unprepared=True)
        return sorted(found, key=itemgetter(0))
    conn = session.connection()
    rows: list[tuple] = []
    for i in range(0, len(steps), 900):  # SQLite caps bound parameters per statement
        rows.extend(conn.execute(base.where(Step.step.in_(steps[i : i + 900])).order_by(Step.step)))
    return rows


def steps_in_array(steps: list[int]) -> Any:
    """``steps.step = ANY(<steps as a bigint[] parameter>)`` (PostgreSQL).

    The array travels as its text, which psycopg sends untyped so that PostgreSQL parses it as
    the parameter's bigint[] (psycopg's dumper of a 5,000-integer list took about 6 ms). It must
    stay untyped: a text parameter cast to bigint[] is not a constant to the planner, which then
    tests each row against the whole array (2.5 s instead of 17 ms for 5,000 of 20,000 steps)
    instead of looking it up in a hash. For the same reason the statement must not be prepared:
    a generic plan would see a parameter, not the array (200 ms instead of 17).

    The step is compared as ``step + 0``, which no index can take: with table statistics,
    PostgreSQL made each of the array's steps an index descent of its own (31 ms for 5,000 of
    a run's 20,000 steps, in a table of several runs), where a scan of the run's steps with the
    array as a hashed filter took 20 (the caller bounds that scan with the steps' range)."""
    text = "{" + ",".join(map(str, steps)) + "}"
    wanted = cast(bindparam("steps", text, type_=NullType()), ARRAY(BigInteger))
    return Step.step + literal_column("0", BigInteger) == func.any(wanted)


def _step_filter(q, run_id: str, split: str, from_step: int | None, to_step: int | None):  # noqa: ANN001, ANN202
    q = q.where(Step.run_id == run_id, Step.split == split)
    if from_step is not None:
        q = q.where(Step.step >= from_step)
    if to_step is not None:
        q = q.where(Step.step <= to_step)
    return q.order_by(Step.step)


def _step_acr_series(
    session: Session, run_id: str, split: str, from_step: int | None, to_step: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The (step, acr) series of a split: steps int64 (n,) ascending, acr float64 (n,) with NaN
    for null. PostgreSQL: from the packed rows of `StepSeries`; SQLite: a scan of the steps."""
    if session.get_bind().dialect.name == "postgresql":
        return _packed_acr_series(session, run_id, split, from_step, to_step)
    rows = _raw_rows(
        session, _step_filter(select(Step.step, Step.acr), run_id, split, from_step, to_step)
    )
    return (
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.float64),  # None -> NaN
    )


_ABSENT = np.frombuffer(ACR_ABSENT, dtype=">u8")[0]


def _packed_acr_series(
    session: Session, run_id: str, split: str, from_step: int | None, to_step: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """`_step_acr_series` from the rows of `StepSeries` that hold the range (PostgreSQL)."""
    q = select(StepSeries.chunk, StepSeries.acrs).where(
        StepSeries.run_id == run_id, StepSeries.split == split
    )
    if from_step is not None:
        q = q.where(StepSeries.chunk >= from_step // SERIES_SLOTS)
    if to_step is not None:
        q = q.where(StepSeries.chunk <= to_step // SERIES_SLOTS)
    rows = _raw_rows(session, q.order_by(StepSeries.chunk))
    chunks = np.array([chunk for chunk, _ in rows], dtype=np.int64)
    slots = np.frombuffer(b"".join(acrs for _, acrs in rows), dtype=">u8")
    steps = (chunks[:, None] * SERIES_SLOTS + np.arange(SERIES_SLOTS)).ravel()
    kept = slots != _ABSENT
    if from_step is not None:
        kept &= steps >= from_step
    if to_step is not None:
        kept &= steps <= to_step
    return steps[kept], slots[kept].view(">f8").astype(np.float64)


def point_json(row: Any) -> str:
    """A step's point of `GET /metrics` as JSON text: step, attempt, time, every step metric,
    `n_completions` (completions in valid groups: the denominator of the share of wasted
    rollouts, as groups need not have the run's group size) and the scalars. ``row``: a step
    row (anything with its columns as attributes)."""
    point = {c: getattr(row, c) for c in POINT_COLUMNS}
    point["n_completions"] = (row.acc or {}).get("n_completions")
    point["scalars"] = row.scalars or {}
    return orjson.dumps(point).decode()


def run_metrics_json(
    session: Session,
    run_id: str,
    split: str = "train",
    from_step: int | None = None,
    to_step: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> bytes:
    """`run_metrics` as the JSON answer's bytes, assembled from the points stored with the step
    rows (no per-field decoding and encoding: most of the time of a 5,000-point answer).

    Two reads: (step, acr) of the whole range to choose the points, then the stored points of
    the chosen steps only, so a 100,000-step run costs one narrow scan."""
    max_points = max(1, max_points)
    steps, acrs = _step_acr_series(session, run_id, split, from_step, to_step)
    downsampled = len(steps) > max_points
    cols = [Step.step, Step.point]
    if downsampled:
        kept = _downsample(steps, acrs, max_points)
        rows = _rows_at_steps(session, cols, run_id, split, kept)
    else:
        rows = _raw_rows(session, _step_filter(select(*cols), run_id, split, from_step, to_step))
    points = [point for _, point in rows]
    missing = [step for step, point in rows if point is None]
    if missing:  # rows written before points were stored
        built = {r.step: point_json(r) for r in _full_rows(session, run_id, split, missing)}
        points = [built[step] if point is None else point for step, point in rows]
    head = orjson.dumps({"run_id": run_id, "downsampled": downsampled})[:-1]
    return b"".join((head, b',"points":[', ",".join(points).encode(), b"]}"))


def _full_rows(session: Session, run_id: str, split: str, steps: list[int]) -> list[Any]:
    """The point columns of the given steps, as rows with attribute access."""
    names = (*POINT_COLUMNS, "acc", "scalars")
    rows = _rows_at_steps(session, [getattr(Step, c) for c in names], run_id, split, steps)
    return [SimpleNamespace(**dict(zip(names, r, strict=True))) for r in rows]


def run_metrics(session: Session, run_id: str, **window: Any) -> dict[str, Any]:
    """`run_metrics_json` (same keyword arguments: split, from_step, to_step, max_points) as a
    dict: ``{run_id, downsampled, points: [{step, attempt, time, <every step metric>,
    scalars}]}`` (docs/design.md §4)."""
    return orjson.loads(run_metrics_json(session, run_id, **window))


def run_window(
    session: Session,
    run_id: str,
    split: str = "train",
    from_step: int | None = None,
    to_step: int | None = None,
) -> dict[str, Any]:
    """Window metrics (docs/design.md §3) over the newest-attempt view; steps with a null acr are
    skipped. Reads at most EMA_TAIL + 100 rows however long the run is."""
    scored = _step_filter(select(Step.acr), run_id, split, from_step, to_step).where(
        Step.acr.is_not(None)
    )
    count, collapsed, valid = session.execute(
        scored.with_only_columns(
            func.count(), func.sum(Step.n_collapsed), func.sum(Step.n_valid)
        ).order_by(None)
    ).one()
    newest_first = scored.order_by(None).order_by(Step.step.desc())
    tail = list(session.scalars(newest_first.limit(EMA_TAIL)))[::-1]
    window = window_metrics({"acr": a, "n_collapsed": 0, "n_valid": 0} for a in tail)
    window["acr_pooled"] = collapsed / valid if valid else None
    if count > EMA_TAIL:
        first = list(session.scalars(scored.limit(100)))
        window["acr_100"] = math.fsum(first) / 100
        if window["acr_streak"] == len(tail):  # the streak is longer than the tail: count it
            last_below = session.scalar(
                scored.with_only_columns(func.max(Step.step))
                .where(Step.acr <= DEFAULT_STREAK_THRESHOLD)
                .order_by(None)
            )
            rest = scored.with_only_columns(func.count()).order_by(None)
            if last_below is not None:
                rest = rest.where(Step.step > last_below)
            window["acr_streak"] = session.scalar(rest)
    return window


MARKED_COMMANDS = ("checkpoint", "stop")


_TIMELINE_FIELDS = ("command_id", "type", "params", "status", "issued_by", "alert_id")


def _timeline_entry(c: Command) -> dict[str, Any]:
    """A command as the mitigation timeline lists it: `command_dict`'s identity fields,
    ``step`` (where the trainer applied it) and ``created_at``."""
    full = command_dict(c)
    return {
        **{k: full[k] for k in _TIMELINE_FIELDS},
        "step": c.acked_step,
        "created_at": full["created_at"],
    }


def applied_commands(
    session: Session, run_id: str, types: tuple[str, ...] = MARKED_COMMANDS
) -> list[dict[str, Any]]:
    """The run's applied commands of ``types`` (default checkpoint and stop), as
    `mitigation_timeline` gives its entries (``step``: where the trainer applied it), in step
    order: the dashboard marks them on the ACR chart beside the timeline."""
    rows = session.scalars(
        select(Command)
        .where(
            Command.run_id == run_id,
            Command.type.in_(types),
            Command.status == "applied",
            Command.acked_step.is_not(None),
        )
        .order_by(Command.acked_step, Command.created_at)
    ).all()
    return [_timeline_entry(c) for c in rows]


def mitigation_timeline(
    session: Session, run_id: str, reported: list[tuple[int, dict]] | None = None
) -> list[dict[str, Any]]:
    """set_mitigation and set_sampling commands, with the step they took effect, and the
    changes of mitigation that the trainer reported but no command explains (a mitigation its
    config started, a local command, a relaunch with other settings) as entries with no
    ``command_id``, ``issued_by`` "trainer" and the first step that reported the mode. In step
    order; commands not yet applied come last, in the order they were issued. ``reported``:
    the run's `reported_mitigation_changes`, when the caller has them (else they are read)."""
    rows = session.scalars(
        select(Command)
        .where(Command.run_id == run_id, Command.type.in_(("set_mitigation", "set_sampling")))
        .order_by(Command.created_at)
    ).all()
    commands = [_timeline_entry(c) for c in rows]
    if reported is None:
        reported = reported_mitigation_changes(session, run_id)
    timeline = commands + _unexplained(commands, reported)
    # a stable sort: commands of one step, and those not applied yet, stay in the order issued
    timeline.sort(key=lambda e: (e["step"] is None, e["step"] or 0))
    return timeline


def _unexplained(commands: list[dict], reported: list[tuple[int, dict]]) -> list[dict]:
    """Timeline entries for the reported changes that no applied set_mitigation explains: one
    acked after step s acts from step s + 1, the first to report it."""
    applied = {
        ((c["params"] or {}).get("mode"), c["step"])
        for c in commands
        if c["type"] == "set_mitigation" and c["status"] == "applied"
    }
    return [
        {
            "command_id": None,
            "type": "set_mitigation",
            "params": params,
            "status": "applied",
            "issued_by": "trainer",
            "alert_id": None,
            "step": step,
            "created_at": None,
        }
        for step, params in reported
        if not {(params.get("mode"), step - 1), (params.get("mode"), step)} & applied
    ]


def reported_mitigation_changes(
    session: Session, run_id: str, after_step: int | None = None
) -> list[tuple[int, dict]]:
    """(step, mitigation) of each training step whose reported mitigation mode differs from that
    of the step before it that reported one (the run's first counts unless its mode is "none"),
    in step order; with ``after_step``, only the changes after that step (a live view's new
    steps). The database compares the modes and returns the changes only: a 20,000-step run
    is one scan of its step rows (about 30 ms), so a live view asks for its new steps only."""
    mode = Step.mitigation["mode"].as_string()
    reporting = select(Step.step).where(
        Step.run_id == run_id, Step.split == "train", mode.is_not(None)
    )
    before = literal(None, String)
    if after_step is not None:
        reporting = reporting.where(Step.step > after_step)
        seed = select(mode).where(
            Step.run_id == run_id, Step.split == "train", Step.step <= after_step, mode.is_not(None)
        )
        before = seed.order_by(Step.step.desc()).limit(1).scalar_subquery()
    scan = reporting.add_columns(
        Step.mitigation,
        mode.label("mode"),
        func.coalesce(func.lag(mode).over(order_by=Step.step), before).label("before"),
    ).subquery()
    changed = (scan.c.before != scan.c.mode) | (scan.c.before.is_(None) & (scan.c.mode != "none"))
    rows = session.execute(
        select(scan.c.step, scan.c.mitigation).where(changed).order_by(scan.c.step)
    ).all()
    return [(step, params) for step, params in rows]


def firing_alerts(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Firing alert episodes of a run."""
    return list_alerts(session, run_id=run_id, state="firing")


def run_summary(
    session: Session, run_id: str, reported: list[tuple[int, dict]] | None = None
) -> dict[str, Any] | None:
    """`GET /summary` of a run, or None when there is none (``reported``: as
    `mitigation_timeline` takes it)."""
    run = session.get(Run, run_id)
    if run is None:
        return None
    return {
        "run_id": run_id,
        "status": run_status(run),
        "last_step": run.last_step,
        "latest_acr": run.latest_acr,
        "window": run_window(session, run_id),
        "alerts": firing_alerts(session, run_id),
        "mitigation_timeline": mitigation_timeline(session, run_id, reported),
        "client": client_health(run),
    }


@dataclass(slots=True)
class _PromptTally:
    """One prompt's valid groups: how many, at which steps, how many collapsed and on which
    side."""

    groups: int = 0
    steps: set[int] = field(default_factory=set)
    sides: dict[str | None, int] = field(default_factory=dict)  # collapsed groups by side

    def add(self, step: int, collapsed: bool, side: str | None) -> None:
        self.groups += 1
        self.steps.add(step)
        if collapsed:
            self.sides[side] = self.sides.get(side, 0) + 1

    def row(self, prompt_id: str) -> dict[str, Any]:
        collapsed = sum(self.sides.values())
        return {
            "prompt_id": prompt_id,
            "groups": self.groups,
            "steps": len(self.steps),
            "collapsed": collapsed,
            **{side: self.sides.get(side, 0) for side in ("all_pass", "all_fail", "constant")},
            "collapse_rate": collapsed / self.groups,
            "last_seen_step": max(self.steps),
        }


def run_prompts(
    session: Session,
    run_id: str,
    side: str | None = None,
    min_steps: int = 1,
    split: str | None = None,
) -> list[dict[str, Any]]:
    """Prompts by how often their groups collapsed, over the newest-attempt view of each step
    and the valid groups (collapsed, near-collapsed, live), as the ACR counts them; of one
    ``split``, or of all (None). Reads the run's blocks that carry prompt ids."""
    blocks = (
        select(GroupBlock.step, GroupBlock.n_groups, GroupBlock.prompt_ids, GroupBlock.data)
        .join(Run, Run.key == GroupBlock.run_key)
        .join(
            Step,
            (Step.run_id == Run.id)
            & (Step.split == GroupBlock.split)
            & (Step.step == GroupBlock.step)
            & (Step.attempt == GroupBlock.attempt),
        )
        .where(Run.id == run_id, GroupBlock.prompt_ids.is_not(None))
    )
    if split is not None:
        blocks = blocks.where(GroupBlock.split == split)
    tally: dict[str, _PromptTally] = {}
    for step, n_groups, prompt_ids, data in session.execute(blocks):
        block = decode_block(n_groups, data)
        sides, classes = block.column("side"), block.cls.tolist()
        for pid, cls, group_side in zip(orjson.loads(prompt_ids), classes, sides, strict=True):
            if pid is not None and cls >= COLLAPSED:
                tally.setdefault(pid, _PromptTally()).add(step, cls == COLLAPSED, group_side)
    out = []
    for pid, t in tally.items():
        row = t.row(pid)
        if len(t.steps) < min_steps or (side is not None and row.get(side, 0) == 0):
            continue
        out.append(row)
    key = side if side in ("all_pass", "all_fail", "constant") else "collapsed"
    out.sort(key=lambda r: (-r[key], -r["groups"], r["prompt_id"]))
    return out


PROMPT_COLUMNS = [
    "prompt_id",
    "groups",
    "steps",
    "collapsed",
    "all_pass",
    "all_fail",
    "constant",
    "collapse_rate",
    "last_seen_step",
]


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: "" for None, and text that a spreadsheet would run as a formula
    (starting with = + - @, tab or CR: client-chosen ids such as prompt ids) behind a "'", as
    OWASP's advice on CSV injection has it."""
    if value is None:
        return ""
    if value in NON_FINITE_TOKENS:  # a scalar's NaN or -Infinity, which pandas reads as such
        return value
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """``rows`` as CSV text under a header of ``columns`` (cells through `csv_cell`)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(columns)
    for r in rows:
        writer.writerow([csv_cell(r.get(c)) for c in columns])
    return buf.getvalue()


EXPORT_CHUNK = 1000  # steps per streamed piece of the CSV export


def iter_export_csv(session: Session, run_id: str, split: str | None = None) -> Iterator[str]:
    """Every per-step metric of a run (all splits unless one is named), plus its scalars, as
    CSV text in pieces of `EXPORT_CHUNK` steps. Two streamed reads (the scalar names, then the
    rows), so memory holds the names and one piece, however long the run: building the whole
    table at once took 22 GB for 10,000 steps of a run with 50,000 scalar names."""
    where = [Step.run_id == run_id, *([Step.split == split] if split else [])]
    names: set[str] = set()
    for (scalars,) in _streamed(session, select(Step.scalars).where(*where)):
        names.update(scalars or {})
    scalar_names = sorted(names)
    columns = ["step", "split", "attempt", "time", *STEP_METRIC_FIELDS]
    query = select(*(getattr(Step, c) for c in columns), Step.scalars).where(*where)
    rows = _streamed(session, query.order_by(Step.split, Step.step))
    yield to_csv([], columns + [f"scalars.{k}" for k in scalar_names])
    while piece := list(islice(rows, EXPORT_CHUNK)):
        buf = io.StringIO()
        writer = csv.writer(buf)
        for *values, scalars in piece:
            scalars = scalars or {}
            writer.writerow(
                [csv_cell(v) for v in values] + [csv_cell(scalars.get(k)) for k in scalar_names]
            )
        yield buf.getvalue()


def export_csv_on_own_session(
    session_factory: Callable[[], Session], run_id: str, split: str | None = None
) -> Iterator[str]:
    """`iter_export_csv` on a session of its own, opened when the first piece is asked for: a
    streamed answer is sent after the request's own session has closed."""
    with session_factory() as session:
        yield from iter_export_csv(session, run_id, split)


def _streamed(session: Session, query: Any) -> Iterator[Any]:
    """The rows of ``query``, fetched `EXPORT_CHUNK` at a time (a server-side cursor on
    PostgreSQL)."""
    return iter(session.execute(query.execution_options(yield_per=EXPORT_CHUNK)))


def prometheus_text(session: Session) -> str:
    """Prometheus exposition of each run's latest ACR (the ingest counters are
    `vantage.server.telemetry`'s)."""
    help_ = "The ACR of the run's latest training step that has one (a valid group)."
    lines = [f"# HELP vantage_run_latest_acr {help_}"]
    lines.append("# TYPE vantage_run_latest_acr gauge")
    for rid, name, acr in session.execute(select(Run.id, Run.name, Run.latest_acr)):
        if acr is not None and math.isfinite(acr):
            label = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
            lines.append(f'vantage_run_latest_acr{{run_id="{rid}",run_name="{label}"}} {acr}')
    return "\n".join(lines) + "\n"
