"""The dashboard's reads and writes: the server's query functions, one session each, filtered
by what the caller's key may see. Callbacks call these; so do the tests and the benchmark."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from vantage.server.queries import PROMPT_COLUMNS
from vantage.server.run_listing import RUN_ORDERS
from vantage.server.run_listing import RUN_STATUSES as RUN_STATUSES  # for the runs page

from . import context

SPARK_STEPS = 200  # the runs table's sparkline covers this many latest steps
SPARK_POINTS = 60
TAIL_STEPS = 300  # steps re-read after a downsampled first load, for the KPI state


def _queries():  # noqa: ANN202
    from vantage.server import queries

    return queries


def _alerts(session, run_id: str | None = None, state: str | None = "firing") -> list[dict]:
    """Alert episodes, when the server has its alerts module (empty otherwise)."""
    lister = getattr(_queries(), "list_alerts", None)
    if lister is None:
        try:
            from vantage.server import alerts
        except ImportError:
            return []
        lister = getattr(alerts, "list_alerts", None)
    if lister is None:
        return []
    return list(lister(session, run_id=run_id, state=state))


# The costs of collapse scan every step of a run or project: not at each refresh.
PROJECT_COST_TTL_S = 60.0
RUN_COST_TTL_S = 30.0
ENDED_COST_TTL_S = 3600.0  # an ended run's steps change only if it is relaunched or pruned
FILTERS_TTL_S = 5.0  # a new run's project and tag reach the filters' lists within this time
_costs: dict[tuple, tuple[float, Any]] = {}
_inflight: set[tuple] = set()  # run costs being computed by a thread (`_run_cost_soon`)
_inflight_lock = threading.Lock()


def _cached(key: tuple, ttl_s: float, compute) -> Any:  # noqa: ANN001
    """``compute()``, or its value of the last ``ttl_s`` seconds for ``key`` (per server)."""
    key = (id(context.state()), *key)
    hit = _costs.get(key)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    value = compute()
    if len(_costs) > 1000:
        _costs.clear()
    _costs[key] = (time.monotonic() + ttl_s, value)
    return value


def _run_cost_soon(run: dict) -> dict | None:
    """The run's cost as `_run_costs` keeps it, or None while it is being computed: the run
    page asks at each live update, and a scan of a 100,000-step run's steps (about a second on
    PostgreSQL) must not hold its first load or a tick; a thread computes it meanwhile."""
    state = context.state()
    key = (id(state), *_cost_key(run))
    hit = _costs.get(key)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    with _inflight_lock:
        if key in _inflight:
            return None
        _inflight.add(key)

    def compute() -> None:
        try:
            with state.session_factory() as s:
                _store(key, run, _run_costs_of(s, [run["run_id"]])[run["run_id"]])
        finally:
            with _inflight_lock:
                _inflight.discard(key)

    threading.Thread(target=compute, name="vantage-run-cost", daemon=True).start()
    return None


def _run_costs_of(session, run_ids: list[str]) -> dict[str, dict]:
    """`vantage.server.cost.run_costs` (imported when first asked)."""
    from vantage.server.cost import run_costs

    return run_costs(session, run_ids)


def _cost_key(run: dict) -> tuple:
    ended = run.get("status") in ("finished", "failed")
    return ("run", run["run_id"], run.get("attempt"), run.get("last_step") if ended else None)


def _store(key: tuple, run: dict, cost: dict) -> None:
    if len(_costs) > 10_000:
        _costs.clear()
    ttl = ENDED_COST_TTL_S if key[-1] is not None else RUN_COST_TTL_S
    _costs[key] = (time.monotonic() + ttl, cost)


def _run_costs(session, runs: list[dict]) -> dict[str, dict]:
    """The cost of each of ``runs`` (`vantage.server.cost.run_costs`): at most RUN_COST_TTL_S
    old while it runs, kept while an ended run stays as it is; those not cached in one query."""
    now, state_id = time.monotonic(), id(context.state())
    out, missing = {}, []
    for run in runs:
        hit = _costs.get((state_id, *_cost_key(run)))
        if hit is not None and hit[0] > now:
            out[run["run_id"]] = hit[1]
        else:
            missing.append(run)
    if missing:
        found = _run_costs_of(session, [r["run_id"] for r in missing])
        for run in missing:
            _store((state_id, *_cost_key(run)), run, found[run["run_id"]])
            out[run["run_id"]] = found[run["run_id"]]
    return out


def _scope(info, project: str | None) -> str | None:
    """The project the key may see (its own when limited to one), else ``project``."""
    own = getattr(info, "project", None) if info is not None else None
    return own or project or None


def runs_overview(
    info,
    project: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    order: str = "newest",
    limit: int | None = None,
) -> tuple[list[dict], int]:
    """The runs the key may see with the given project, tag and status (None: any), in
    ``order`` (a RUN_ORDERS key; newest first within ties), as (the first ``limit`` of them,
    how many there are); filters, order and limit are the database's
    (`vantage.server.run_listing`), so only the shown runs are read. Each has ``health``,
    ``cost`` (`vantage.server.cost`), ``spark`` (recent ACRs), ``latest_effective`` (the
    effective ACR of the step of ``latest_acr``) and ``alerts`` (firing episodes)."""
    from vantage.server import run_listing

    if not context.can(info, "read"):
        return [], 0
    filters = {"project": _scope(info, project), "tag": tag or None, "status": status or None}
    order = order if order in RUN_ORDERS else "newest"
    with context.session() as s:
        total = run_listing.count_runs(s, **filters)
        shown, _next = run_listing.runs_page(
            s, order=order, limit=max(1, limit if limit is not None else total), **filters
        )
        if limit is not None and limit <= 0:
            shown = []
        sparks = run_listing.recent_acrs(s, shown, SPARK_STEPS, SPARK_POINTS)
        costs = _run_costs(s, shown)
        for run in shown:
            run["cost"] = costs[run["run_id"]]
            run["alerts"] = _alerts(s, run["run_id"]) if run["alerts_firing"] else []
            run["spark"] = sparks[run["run_id"]]
    return shown, total


def project_costs(info, project: str | None = None) -> dict[str | None, dict]:
    """`vantage.server.cost.project_costs` of the projects the key sees (of ``project`` only
    when given; None: the runs without a project), at most PROJECT_COST_TTL_S old."""
    from vantage.server import cost, run_listing

    if not context.can(info, "read"):
        return {}
    scope = _scope(info, project)

    def compute() -> dict:
        with context.session() as s:
            projects = [scope] if scope else [*run_listing.filter_values(s)[0], None]
            return cost.project_costs(s, projects)

    return _cached(("projects", scope), PROJECT_COST_TTL_S, compute)


def visible_runs(info) -> list[dict]:
    with context.session() as s:
        return [r for r in _queries().list_runs(s) if context.can_see(info, r)]


def visible_run(info, run_id: str) -> dict | None:
    """The run (as the API shows it), or None when it does not exist or the key may not see it."""
    with context.session() as s:
        run = _queries().get_run(s, run_id)
    return run if context.can_see(info, run) else None


def filter_options(info, fresh: bool = False) -> tuple[list[str], list[str]]:
    """The projects and tags of the runs the key may see (for the runs page's filters), at
    most FILTERS_TTL_S old unless ``fresh`` (a page's address that names a new tag)."""
    from vantage.server import run_listing

    if not context.can(info, "read"):
        return [], []
    scope = _scope(info, None)

    def compute() -> tuple[list[str], list[str]]:
        with context.session() as s:
            return run_listing.filter_values(s, scope)

    # at every refresh of the runs page, and a scan of every run's tags
    return compute() if fresh else _cached(("filters", scope), FILTERS_TTL_S, compute)


def run_snapshot(info, run_id: str, max_points: int = 5000) -> dict[str, Any] | None:
    """Everything the run page shows on first load, or None if missing or not visible."""
    q = _queries()
    with context.session() as s:
        run = q.get_run(s, run_id)
        if not context.can_see(info, run):
            return None
        metrics = q.run_metrics(s, run_id, max_points=max_points)
        reported = q.reported_mitigation_changes(s, run_id)  # kept for the live updates
        summary = q.run_summary(s, run_id, reported=reported) or {}
        # the chart's timeline: the mitigation timeline and the applied checkpoints and stops
        summary["mitigation_timeline"] = [
            *(summary.get("mitigation_timeline") or []),
            *q.applied_commands(s, run_id),
        ]
        alerts = _alerts(s, run_id, state=None)
        run["cost"] = _run_cost_soon(run)
        tail = metrics["points"]
        if metrics["downsampled"] and run.get("last_step") is not None:
            tail = q.run_metrics(s, run_id, from_step=run["last_step"] - TAIL_STEPS + 1)["points"]
    return {
        "run": run,
        "metrics": metrics,
        "summary": summary,
        "alerts": alerts,
        "tail": tail,
        "reported": reported,
    }


def run_since(
    info, run_id: str, after_step: int | None, reported: list | None = None
) -> dict[str, Any] | None:
    """A live update: the run, the steps after ``after_step``, ``again`` (step ``after_step``
    read again, or None: its scalars may have come after its groups), and what changes rarely.
    ``reported``: the run's mitigation changes up to ``after_step`` (`run_snapshot`'s, then
    each update's), extended here with those of the new steps only (the whole run's were one
    scan of every step at each tick)."""
    q = _queries()
    with context.session() as s:
        run = q.get_run(s, run_id)
        if not context.can_see(info, run):
            return None
        run["cost"] = _run_cost_soon(run)
        points = q.run_metrics(s, run_id, from_step=after_step)["points"]
        again = None
        if after_step is not None and points and points[0]["step"] == after_step:
            again, points = points[0], points[1:]
        alerts = _alerts(s, run_id, state=None)  # for the banner, also without new steps
        timeline = None
        if points:
            known = [tuple(c) for c in reported or []] if after_step is not None else []
            reported = known + q.reported_mitigation_changes(s, run_id, after_step)
            timeline = [
                *q.mitigation_timeline(s, run_id, reported=reported),
                *q.applied_commands(s, run_id),
            ]
    return {
        "run": run,
        "points": points,
        "alerts": alerts,
        "timeline": timeline,
        "reported": reported,
        "again": again,
    }


def latest_point(run: dict) -> dict | None:
    """The newest training step of a ``run`` the caller may see (a metrics point, with the
    trainer's scalars), or None before its first."""
    if run.get("last_step") is None:
        return None
    with context.session() as s:
        points = _queries().run_metrics(s, run["run_id"], from_step=run["last_step"])["points"]
    return points[-1] if points else None


def split_points(
    info, run_id: str, split: str, after_step: int | None = None, max_points: int = 2000
) -> list[dict] | None:
    """The steps of one ``split`` of a run (after ``after_step``, else all, downsampled to
    ``max_points``); None if the run is missing or not visible."""
    q = _queries()
    with context.session() as s:
        if not context.can_see(info, q.get_run(s, run_id)):
            return None
        from_step = None if after_step is None else after_step + 1
        window = {"split": split, "from_step": from_step, "max_points": max_points}
        return q.run_metrics(s, run_id, **window)["points"]


def commands(info, run_id: str) -> list[dict] | None:
    q = _queries()
    with context.session() as s:
        if not context.can_see(info, q.get_run(s, run_id)):
            return None
        out = q.list_commands(s, run_id)
        s.commit()  # list_commands may mark expired commands
    return out


def issue_command(
    info, run_id: str, type_: str, params: dict, reason: str | None, alert_id: int | None = None
) -> dict:
    """Create a command as the caller, or return its twin: the same one sent within 5 s and not
    yet acked, a second click on Send (`commands.issue_once`); it expires after the server's
    `command_ttl_s`. Raises PermissionError or ValueError with a message."""
    from vantage.server import commands as server_commands

    if not context.can(info, "control"):
        raise PermissionError("this key lacks the control scope; ask an admin for one")
    q = _queries()
    ttl_s = getattr(context.state().settings, "command_ttl_s", server_commands.DEFAULT_TTL_S)
    with context.session() as s:
        run = q.get_run(s, run_id)
        if not context.can_see(info, run):
            raise PermissionError("run not found or not visible to this key")
        server_commands.check_run_listens(run_id, run["status"])
        cmd = server_commands.issue_once(
            s, run_id, type_, params, reason, f"dashboard:{info.name}", ttl_s, alert_id
        )
        s.commit()
    return cmd


def prompts(
    info, run_id: str, side: str | None = None, min_steps: int = 1, split: str | None = None
) -> list[dict] | None:
    """The run's prompts by collapses (`queries.run_prompts`): of ``split``, or all splits."""
    q = _queries()
    with context.session() as s:
        if not context.can_see(info, q.get_run(s, run_id)):
            return None
        return q.run_prompts(s, run_id, side or None, min_steps, split or None)


def prompts_csv(info, run_id: str, side: str | None = None, split: str | None = None) -> str | None:
    rows = prompts(info, run_id, side, split=split)
    return None if rows is None else _queries().to_csv(rows, PROMPT_COLUMNS)


def metrics_csv(info, run_id: str, split: str | None = None) -> Iterator[str] | None:
    """The run's export CSV in pieces, of one ``split`` or all (None: not found or not visible
    to ``info``); the pieces are read on a session of their own as they are sent, so a long
    run is never held whole."""
    q = _queries()
    factory = context.state().session_factory
    with factory() as s:
        if not context.can_see(info, q.get_run(s, run_id)):
            return None
    return q.export_csv_on_own_session(factory, run_id, split)


def run_marks(info, run_ids: list[str]) -> list[list]:
    """[run_id, attempt, last_step, status] of each visible run of ``run_ids``: what changes
    when a run has news (the compare page redraws only then)."""
    q = _queries()
    out = []
    with context.session() as s:
        for rid in dict.fromkeys(run_ids):
            run = q.get_run(s, rid)
            if context.can_see(info, run):
                out.append([rid, run.get("attempt"), run.get("last_step"), run.get("status")])
    return out


def compare(info, run_ids: list[str], max_points: int = 2000) -> dict[str, Any]:
    """Runs, their metrics (downsampled), window metrics, mitigation timelines and totals
    (``totals``: `comparison.run_totals` with `cost.run_costs`'s wasted rollouts), for the
    compare page."""
    from vantage.server.comparison import run_totals
    from vantage.server.cost import run_costs

    q = _queries()
    runs, metrics, windows, timelines = [], {}, {}, {}
    with context.session() as s:
        for rid in dict.fromkeys(run_ids):  # each run once, in the order given
            run = q.get_run(s, rid)
            if not context.can_see(info, run):
                continue
            runs.append(run)
            metrics[rid] = q.run_metrics(s, rid, max_points=max_points)["points"]
            summary = q.run_summary(s, rid) or {}
            windows[rid] = summary.get("window", {})
            timelines[rid] = summary.get("mitigation_timeline", [])
        shown = [r["run_id"] for r in runs]
        totals, costs = run_totals(s, shown), run_costs(s, shown)
    for rid in shown:
        totals[rid].update(costs.get(rid) or {})
    return {
        "runs": runs,
        "metrics": metrics,
        "windows": windows,
        "timelines": timelines,
        "totals": totals,
    }


def samples(info, run_id: str, prompt_id: str | None, limit: int = 5) -> list[dict] | None:
    """The run's latest completion samples of ``prompt_id`` (`samples.list_samples`, newest
    step first); None if the run is missing or not visible to ``info``."""
    from vantage.server.samples import list_samples

    with context.session() as s:
        if not context.can_see(info, _queries().get_run(s, run_id)):
            return None
        return list_samples(s, run_id, prompt_id=prompt_id, limit=limit)
