"""The dashboard's reads and writes: the server's query functions, one session each, filtered
by what the caller's key may see. Callbacks call these; so do the tests and the benchmark."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from vantage.server.queries import PROMPT_COLUMNS

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


RUN_STATUSES = ("running", "stale", "finished", "failed")
# how the runs list can be ordered: key → its label (the first is the default)
RUN_ORDERS = {
    "newest": "newest first",
    "alerts": "most firing alerts first",
    "acr": "highest latest ACR first (raw)",
}


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
    how many there are). Each shown run has ``spark`` (recent ACRs), ``latest_effective``
    (the newest step's effective ACR, or None) and ``alerts`` (firing episodes); only the shown
    runs' sparklines are read (every run's, each refresh, on a list of hundreds)."""
    q = _queries()
    if info is not None and getattr(info, "project", None):
        project = info.project
    with context.session() as s:
        runs = q.list_runs(s, project=project or None, tag=tag or None)
        runs = [r for r in runs if context.can_see(info, r)]
        if status:
            runs = [r for r in runs if r.get("status") == status]
        alerts_by_run: dict[str, list] = {}
        for a in _alerts(s):
            alerts_by_run.setdefault(a.get("run_id"), []).append(a)
        for run in runs:
            run["alerts"] = alerts_by_run.get(run["run_id"], [])
        runs = _ordered(runs, order)
        shown = runs if limit is None else runs[: max(0, limit)]
        for run in shown:
            _add_sparkline(s, q, run)
    return shown, len(runs)


def _ordered(runs: list[dict], order: str) -> list[dict]:
    """``runs`` (newest first) in ``order``; a stable sort keeps newest first within ties."""
    if order == "alerts":
        return sorted(runs, key=lambda r: -len(r["alerts"]))
    if order == "acr":
        # runs without an ACR last
        return sorted(
            runs, key=lambda r: (r.get("latest_acr") is None, -(r.get("latest_acr") or 0))
        )
    return runs


def _add_sparkline(session, q, run: dict) -> None:
    """Set the run's ``spark`` (ACRs of its last SPARK_STEPS steps) and ``latest_effective``."""
    last = run.get("last_step")
    spark: list = []
    run["latest_effective"] = None
    if last is not None:
        m = q.run_metrics(
            session, run["run_id"], from_step=last - SPARK_STEPS + 1, max_points=SPARK_POINTS
        )
        spark = [p.get("acr") for p in m["points"]]
        # the newest step's, as the run page shows it (an older step's sat beside the newest
        # ACR)
        run["latest_effective"] = m["points"][-1].get("acr_effective") if spark else None
    run["spark"] = spark


def visible_runs(info) -> list[dict]:
    with context.session() as s:
        return [r for r in _queries().list_runs(s) if context.can_see(info, r)]


def visible_run(info, run_id: str) -> dict | None:
    """The run (as the API shows it), or None when it does not exist or the key may not see it."""
    with context.session() as s:
        run = _queries().get_run(s, run_id)
    return run if context.can_see(info, run) else None


def filter_options(info) -> tuple[list[str], list[str]]:
    """The projects and tags of the runs the key may see (for the runs page's filters)."""
    runs = visible_runs(info)
    projects = sorted({r["project"] for r in runs if r.get("project")})
    tags = sorted({t for r in runs for t in (r.get("tags") or [])})
    return projects, tags


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
    """Runs, their metrics (downsampled), window metrics and mitigation timelines, for the
    compare page."""
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
    return {"runs": runs, "metrics": metrics, "windows": windows, "timelines": timelines}
