"""A run's health report from stored data (`vantage diagnose RUN`, docs/detectors.md): each
rule's verdict with the steps it would fire, the ACR summary and the wasted share of rollouts,
the commands applied and what changed after them, and the recommended next actions.

"Would fire" replays every enabled rule that applies to the run over its stored training steps,
as evaluation takes them (warmup, baseline, for_steps, clear, cooldown), whatever the rule's
history on the run: a rule created after the run, or a detector the run predates, gets a
verdict too. The alerts that did fire are listed beside it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .alerts.detectors import components, detect, rule_value, uses_detector
from .alerts.episodes import OPS, past_clear
from .alerts.listing import list_alerts
from .alerts.messages import recommended_action
from .alerts.metrics import SERIES_METRICS, Window
from .alerts.states import rules_and_states
from .commands import ENDED_STATES, list_commands
from .models import Run, Step
from .queries import run_status

# The steps before and after a command whose means show what it changed.
COMPARE_STEPS = 10
# A rule that fired within this many steps of the run's last step is "firing" in the verdict.
RECENT_STEPS = 20
STALL_ACR = 0.35  # docs/design.md §1: "ACR > 0.35 for more than 50 steps" marks stalled runs


class RunNotFound(LookupError):
    """No run has this id, or starts with it (8 characters or more) alone; or the run has
    steps, none in the split asked for."""


# The shortest start of a run id that names a run (the dashboard shows ids' first 8).
SHORT_ID = 8


def find_run(session: Session, run_id: str) -> Run:
    """The run of id ``run_id``, or the only one whose id starts with it (at least `SHORT_ID`
    characters, the short id the dashboard shows). Raises RunNotFound, naming the runs a
    start fits when it fits several."""
    run = session.get(Run, run_id)
    if run is not None:
        return run
    found = []
    if len(run_id) >= SHORT_ID:
        q = select(Run).where(Run.id.startswith(run_id, autoescape=True)).limit(3)
        found = list(session.scalars(q))
    if len(found) == 1:
        return found[0]
    if found:
        raise RunNotFound(
            f"{run_id!r} is the start of several runs' ids ({', '.join(r.id for r in found)}"
            f"{', ...' if len(found) > 2 else ''}): give more of the id"
        )
    raise RunNotFound(f"no run {run_id!r}: `vantage diagnose` takes a run id (GET /api/v1/runs)")


def diagnose(session: Session, run_id: str, split: str = "train") -> dict[str, Any]:
    """The report as a JSON-able dict: ``run``, ``acr``, ``rules`` (one verdict each),
    ``alerts`` (episodes stored), ``commands`` (applied ones with ``before``/``after`` means)
    and ``next_actions`` (lines). ``run_id``: an id or a unique start of one (`find_run`).
    Raises RunNotFound, also for a split the run has no steps in while it has steps in
    others (naming them); a run with no steps at all has "no data yet"."""
    run = find_run(session, run_id)
    run_id = run.id
    splits = sorted(session.scalars(select(Step.split).where(Step.run_id == run_id).distinct()))
    if splits and split not in splits:
        raise RunNotFound(
            f"run {run_id} has no steps in split {split!r}: its splits are {', '.join(splits)}"
        )
    rows = list(
        session.scalars(
            select(Step).where(Step.run_id == run_id, Step.split == split).order_by(Step.step)
        )
    )
    ended = run.status in ENDED_STATES
    rules = [r for r in _rules(session, run) if r.split == split and r.metric != "stale"]
    verdicts = [_replay(rule, rows, run, ended) for rule in rules]
    acr = _acr_summary(rows)
    commands = _commands(session, run_id, rows)
    no_data = "no data yet: the run has no steps stored; the report fills in as they arrive"
    actions = _next_actions(verdicts, acr, commands) if rows else [no_data]
    return {
        "run": {
            "run_id": run.id,
            "name": run.name,
            "project": run.project,
            "status": run_status(run),
            "last_step": run.last_step,
            "reward_min": run.reward_min,
            "reward_max": run.reward_max,
            "mitigation_mode": run.mitigation_mode,
            "steps": len(rows),
        },
        "acr": acr,
        "rules": verdicts,
        "alerts": list_alerts(session, run_id=run_id),
        "commands": commands,
        "next_actions": actions,
    }


def _rules(session: Session, run: Run) -> list[Any]:
    """The enabled rules that apply to the run, as evaluation reads them (its own state is
    not used: the replay starts from nothing)."""
    state = SimpleNamespace(id=run.id, project=run.project, key=run.key, alert_epoch=None)
    rules, _ = rules_and_states(session, state)  # type: ignore[arg-type]
    session.info.pop("alert_config", None)  # a read: nothing to remember after a commit
    return rules


def _replay(rule: Any, rows: list[Step], run: Run, ended: bool) -> dict[str, Any]:
    """The steps ``rule`` would fire at over ``rows`` (pending → firing → resolved, §6). An
    ``ended`` run's alerts ended with it: a rule still firing at its last step "fired
    recently"."""
    bounds = (run.reward_min, run.reward_max)
    window, baseline = Window(), None
    needs = {rule.metric} & SERIES_METRICS
    fired: list[int] = []
    resolved: list[int] = []
    streak = clear = 0
    firing, last, seen = False, None, 0
    for row in rows:
        series = window.walk([row], needs, bounds) if needs else {}
        value = rule_value(row, rule.metric, series)
        if uses_detector(rule):
            value, baseline = detect(baseline, rule, row.step, components(row, rule.metric, value))
        if value is None or row.n_valid < rule.min_valid_groups:
            continue
        seen, last = seen + 1, value
        cond = OPS[rule.op](value, rule.threshold)
        if firing:
            clear = clear + 1 if past_clear(rule, value) else 0
            if clear >= max(1, rule.clear_steps or 1):
                firing, streak, clear = False, 0, 0
                resolved.append(row.step)
            continue
        streak = streak + 1 if cond else 0
        cooling = fired and row.step < fired[-1] + (rule.alert_cooldown_steps or 0)
        if streak >= max(1, rule.for_steps or 1) and not cooling:
            firing, clear = True, 0
            fired.append(row.step)
    last_step = rows[-1].step if rows else None
    if firing and not ended:
        verdict = "firing"
    elif firing or (fired and last_step is not None and fired[-1] >= last_step - RECENT_STEPS):
        verdict = "fired recently"
    elif fired:
        verdict = "fired earlier"
    else:
        verdict = "ok" if seen else "no data"
    return {
        "rule": rule.name,
        "builtin": bool(rule.builtin),
        "metric": rule.metric,
        "comparison": rule.comparison,
        "condition": f"{rule.op} {rule.threshold:g}",
        "severity": rule.severity,
        "verdict": verdict,
        "fires_at": fired,
        "resolves_at": resolved,
        "last_value": last,
        "recommended_action": recommended_action(rule, run),
        "suggested_command": rule.suggested_command,
    }


def _acr_summary(rows: list[Step]) -> dict[str, Any]:
    """Pooled ACR and sides, mean effective ACR, wasted rollouts and their share of the
    completions of valid groups, the steps above the stall level."""
    valid = sum(r.n_valid for r in rows if r.acr is not None)
    collapsed = sum(r.n_collapsed for r in rows if r.acr is not None)
    sides = {"all_pass": 0.0, "all_fail": 0.0, "constant": 0.0}
    for r in rows:
        for side in sides:
            share = getattr(r, f"acr_{side}")
            if share is not None:
                sides[side] += share * r.n_valid
    wasted = sum(r.wasted_rollouts or 0 for r in rows)
    completions = sum(int((r.acc or {}).get("n_completions") or 0) for r in rows)
    effective = [r.acr_effective for r in rows if r.acr_effective is not None]
    measured = [r for r in rows if r.acr is not None]
    return {
        "steps_measured": len(measured),
        "acr_pooled": collapsed / valid if valid else None,
        "acr_latest": measured[-1].acr if measured else None,
        "acr_effective_mean": math.fsum(effective) / len(effective) if effective else None,
        "acr_effective_latest": effective[-1] if effective else None,
        "sides": {k: (v / valid if valid else None) for k, v in sides.items()},
        "steps_above_stall": sum(1 for r in measured if r.acr > STALL_ACR),
        "wasted_rollouts": wasted,
        "completions": completions,
        "wasted_share": wasted / completions if completions else None,
        "n_out_of_range": sum(r.n_out_of_range or 0 for r in rows),
    }


def _commands(session: Session, run_id: str, rows: list[Step]) -> list[dict[str, Any]]:
    """Applied commands, oldest first, each with the means of ACR, effective ACR, reward and
    the canonical scalars over the `COMPARE_STEPS` steps up to its step and those after."""
    out = []
    for c in reversed(list_commands(session, run_id)):
        if c["status"] != "applied" or c["acked_step"] is None:
            continue
        at = c["acked_step"]
        before = [r for r in rows if at - COMPARE_STEPS < r.step <= at]
        after = [r for r in rows if at < r.step <= at + COMPARE_STEPS]
        out.append(
            {
                "type": c["type"],
                "params": c["params"],
                "issued_by": c["issued_by"],
                "step": at,
                "before": _means(before),
                "after": _means(after),
            }
        )
    return out


MEANS = ("acr", "acr_effective", "reward_mean", "reward_std")
SCALARS = ("entropy", "kl", "grad_norm", "loss")


def _means(rows: list[Step]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"steps": len(rows)}  # type: ignore[dict-item]
    for name in MEANS:
        out[name] = _mean(getattr(r, name) for r in rows)
    for name in SCALARS:
        out[name] = _mean((r.scalars or {}).get(name) for r in rows)
    return out


def _mean(values: Any) -> float | None:
    xs = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return math.fsum(xs) / len(xs) if xs else None


def _next_actions(
    verdicts: list[dict[str, Any]], acr: dict[str, Any], commands: list[dict[str, Any]]
) -> list[str]:
    """What to do next, most urgent first: the recommended actions of the rules firing now or
    lately (critical first), then what the ACR summary suggests."""
    actions: list[str] = []
    live = [v for v in verdicts if v["verdict"] in ("firing", "fired recently")]
    live.sort(key=lambda v: (v["severity"] != "critical", v["verdict"] != "firing"))
    for v in live:
        action = v["recommended_action"] or f"look into {v['metric']}"
        actions.append(f"{v['rule']} ({v['verdict']}, {v['severity']}): {action}")
    pooled, effective = acr["acr_pooled"], acr["acr_effective_latest"]
    if pooled is not None and pooled > STALL_ACR:
        sides = acr["sides"]
        side = max(sides, key=lambda k: sides[k] or 0.0)
        why = {
            "all_pass": "most collapsed groups are all-pass: the prompts are too easy for the "
            "policy; sample harder prompts",
            "all_fail": "most collapsed groups are all-fail: the prompts are too hard; sample "
            "easier prompts or warm-start with SFT",
            "constant": "most collapsed groups share one reward that is neither bound: check "
            "the reward function",
        }[side]
        if effective is not None and effective <= 0.05:
            actions.append(
                f"raw ACR {pooled:.2f} but effective ACR {effective:.2f}: the mitigation gives "
                f"every group a gradient, yet {_share(acr['wasted_share'])} of rollouts stay "
                f"collapsed; {why}"
            )
        else:
            actions.append(
                f"ACR {pooled:.2f} over the run: turn on AVSPO (set_mitigation avspo) or DAPO; "
                f"{why}"
            )
    if acr["n_out_of_range"]:
        actions.append(
            f"{acr['n_out_of_range']} reward(s) outside the run's bounds: set reward_min and "
            "reward_max to your reward's range"
        )
    if not actions:
        actions.append("nothing to do: no rule fires and the ACR is below the stall level")
    return actions


def _share(x: float | None) -> str:
    return "an unknown share" if x is None else f"{100 * x:.0f}%"
