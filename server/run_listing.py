"""`GET /api/v1/runs` and the runs page: one page of runs, filtered and ordered in the database,
with a cursor to the next page (keyset pagination: a page costs the same however deep it is)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import and_, cast, exists, false, func, not_, or_, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from .commands import mitigation_state
from .cost import run_costs
from .health import WORST_FIRST
from .models import Run, Step, as_utc
from .queries import run_dict
from .run_health import HealthSQL, attach_health, health_sql, stale_condition

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# key -> what it orders by (newest first within ties, then the run id)
RUN_ORDERS = {
    "newest": "newest first",
    "health": "health, worst first",
    "acr": "highest latest ACR first (raw)",
    "alerts": "most firing alerts first",
}
RUN_STATUSES = ("running", "stale", "finished", "failed")


class BadCursor(ValueError):
    """A cursor that this listing did not make, or made for another order."""


def _keys(session: Session, order: str, now: datetime, health: HealthSQL) -> list[tuple[Any, bool]]:
    """(expression, descending) of ``order``, ending with the tie-breakers."""
    ties = [(Run.created_at, True), (Run.id, True)]
    if order == "health":
        return [(health.rank(session, now), False), *ties]
    if order == "acr":  # runs without an ACR last
        return [(func.coalesce(Run.latest_acr, -1.0), True), *ties]
    if order == "alerts":
        return [(health.firing_count(), True), *ties]
    return ties


def _has_tag(session: Session, tag: str) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return cast(Run.tags, JSONB).contains([tag])
    each = func.json_each(Run.tags).table_valued("value")
    return exists(select(1).select_from(each).where(each.c.value == tag))


def _filters(
    session: Session,
    project: str | None,
    tag: str | None,
    status: str | None,
    health: str | None,
    now: datetime,
    sql: HealthSQL,
) -> list[Any]:
    where: list[Any] = []
    if project is not None:
        where.append(Run.project == project)
    if tag is not None:
        where.append(_has_tag(session, tag))
    if status in ("finished", "failed"):
        where.append(Run.status == status)
    elif status == "stale":
        where.append(stale_condition(session, now))
    elif status == "running":
        where.append(and_(Run.status == "running", not_(stale_condition(session, now))))
    elif status is not None:
        where.append(false())
    if health is not None:
        rank = WORST_FIRST.index(health) if health in WORST_FIRST else -1
        where.append(sql.rank(session, now) == rank)
    return where


def _encode(order: str, values: list[Any]) -> str:
    raw = orjson.dumps({"order": order, "after": values})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str, order: str, n: int) -> list[Any]:
    try:
        body = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after = body["after"]
        ok = body["order"] == order and isinstance(after, list) and len(after) == n
        after[-2] = datetime.fromisoformat(after[-2])
        after[-1] = str(after[-1])
    except Exception as exc:
        raise BadCursor("this cursor was not made by GET /api/v1/runs; drop it") from exc
    if not ok:
        raise BadCursor(
            f"this cursor belongs to another order than {order!r}; ask the first page again"
        )
    return after


def _after(keys: list[tuple[Any, bool]], values: list[Any]) -> Any:
    """Rows strictly after ``values`` in the order of ``keys``."""
    alternatives = []
    for i, (expr, desc) in enumerate(keys):
        tied = [k == v for (k, _), v in zip(keys[:i], values[:i], strict=True)]
        alternatives.append(and_(*tied, expr < values[i] if desc else expr > values[i]))
    return or_(*alternatives)


def runs_page(
    session: Session,
    project: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    health: str | None = None,
    order: str = "newest",
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    now: datetime | None = None,
    with_cost: bool = False,
) -> tuple[list[dict[str, Any]], str | None]:
    """(up to ``limit`` runs as the API shows them, with ``health`` and, ``with_cost``, their
    ``cost`` (`cost.run_costs`); the cursor of the next page, or None after the last).
    Filters: ``project``, ``tag``, ``status`` (one of RUN_STATUSES), ``health`` (a verdict);
    ``order``: a RUN_ORDERS key. Raises BadCursor."""
    now = now or datetime.now(UTC)
    sql = health_sql()
    keys = _keys(session, order, now, sql)
    where = _filters(session, project, tag, status, health, now, sql)
    if cursor:
        where.append(_after(keys, _decode(cursor, order, len(keys))))
    q = sql.join(select(Run, *(k for k, _ in keys))).where(*where)
    q = q.order_by(*(k.desc() if desc else k.asc() for k, desc in keys)).limit(limit + 1)
    rows = session.execute(q).all()
    more = len(rows) > limit
    rows = rows[:limit]
    states = mitigation_state(session, [row[0].id for row in rows])
    runs = attach_health(session, [run_dict(row[0], states[row[0].id]) for row in rows])
    if with_cost:  # a scan of each run's steps: asked for, not by default
        costs = run_costs(session, [r["run_id"] for r in runs])
        for r in runs:
            r["cost"] = costs[r["run_id"]]
    next_cursor = None
    if more and rows:
        *values, created, run_id = rows[-1][1:]
        next_cursor = _encode(order, [*values, as_utc(created).isoformat(), run_id])
    return runs, next_cursor


def count_runs(
    session: Session,
    project: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    health: str | None = None,
) -> int:
    """How many runs match the filters (as `runs_page` takes them)."""
    sql = health_sql()
    where = _filters(session, project, tag, status, health, datetime.now(UTC), sql)
    query = select(func.count(Run.id))
    if health is not None:  # the joins only where the verdict is asked for
        query = sql.join(query)
    return session.scalar(query.where(*where)) or 0


def filter_values(session: Session, project: str | None = None) -> tuple[list[str], list[str]]:
    """(the projects, the tags) of the runs (of ``project`` only, when given), sorted."""
    scope = [Run.project == project] if project is not None else []
    projects = session.scalars(
        select(Run.project).where(Run.project.is_not(None), *scope).distinct()
    ).all()
    if session.get_bind().dialect.name == "postgresql":
        each = func.jsonb_array_elements_text(cast(Run.tags, JSONB))
        tags = session.scalars(select(each).where(*scope).distinct()).all()
    else:
        where = "WHERE runs.project = :project" if project is not None else ""
        tags = session.scalars(
            text(f"SELECT DISTINCT value FROM runs, json_each(runs.tags) {where}"),
            {"project": project} if project is not None else {},
        ).all()
    return sorted(projects), sorted({t for t in tags if isinstance(t, str)})


def recent_acrs(
    session: Session, runs: list[dict[str, Any]], steps: int, points: int
) -> dict[str, list[float | None]]:
    """Per run (dicts with ``run_id`` and ``last_step``): the ACRs of its last ``steps``
    training steps, thinned to at most ``points`` evenly spaced ones (the runs list's
    sparklines). One query for every run: one read per run took 30 ms each on a page of 50."""
    out: dict[str, list[float | None]] = {r["run_id"]: [] for r in runs}
    recent = [r for r in runs if r.get("last_step") is not None]
    if not recent:
        return out
    rows = session.execute(
        select(Step.run_id, Step.acr)
        .join(Run, Run.id == Step.run_id)
        .where(
            Step.run_id.in_([r["run_id"] for r in recent]),
            Step.split == "train",
            Step.step > Run.last_step - steps,
        )
        .order_by(Step.run_id, Step.step)
    ).all()
    for run_id, acr in rows:
        out[run_id].append(acr)
    for run_id, acrs in out.items():
        if len(acrs) > points:  # evenly spaced, ending with the newest
            n = len(acrs)
            out[run_id] = [
                acrs[n - 1 - (points - 1 - i) * (n - 1) // (points - 1)] for i in range(points)
            ]
    return out
