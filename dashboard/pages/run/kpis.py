"""The run page's KPI cards, kept current without re-reading the whole run.

The first load takes the window metrics from the server (``run_summary``); each live update
advances them with only the new steps, by the same rules as ``vantage.client.acr.window_metrics``
(EMA, streak, first-100 mean, last-25 volatility). The state is plain JSON so it can live in a
``dcc.Store`` in the browser between updates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dash import html
from vantage.client.acr import DEFAULT_STREAK_THRESHOLD, EMA_ALPHA, sample_std
from vantage.dashboard import explain
from vantage.dashboard.components import cost_text, current_mitigation

TAIL = 25  # steps kept for volatility, speed and the wasted share


def _tail_row(p: dict) -> list:
    return [
        p["step"],
        p.get("time"),
        p.get("acr"),
        p.get("wasted_rollouts"),
        p.get("n_valid"),
        p.get("n_completions"),
    ]


def initial_state(
    window: dict, points: Sequence[dict], downsampled: bool, attempt: int | None
) -> dict[str, Any]:
    """KPI state after the first load: the server's window metrics and the newest steps.

    ``points`` must hold every step at the end of the run (``downsampled`` False), or at least
    its last TAIL steps."""
    first: list[float] | None = None
    if window.get("acr_100") is None and not downsampled:
        first = [p["acr"] for p in points if p.get("acr") is not None][:100]
    return {
        "ema": window.get("acr_ema"),
        "streak": int(window.get("acr_streak") or 0),
        "acr_100": window.get("acr_100"),
        "first": first,
        "volatility": window.get("acr_volatility"),
        "tail": [_tail_row(p) for p in points[-TAIL:]],
        "last_step": points[-1]["step"] if points else None,
        "attempt": attempt,
        "latest": _latest(points),
    }


def _latest(points: Sequence[dict], previous: dict | None = None) -> dict | None:
    """The latest values the cards show: those of the newest of ``points`` that has an ACR,
    else ``previous`` (the cards' latest so far) if it has one, else the newest point. A step
    of scalars only, or of invalid groups only, keeps the ACR last known, as the runs list and
    the API's ``latest_acr`` do: the card read "—" at such a step."""
    keys = ("step", "acr", "acr_effective", "reward_mean", "pass_rate", "excess_acr")
    scored = next((p for p in reversed(points) if p.get("acr") is not None), None)
    if scored is None:
        if not points or (previous is not None and previous.get("acr") is not None):
            return previous
        scored = points[-1]
    return {k: scored.get(k) for k in keys}


def advance(state: dict[str, Any], points: Sequence[dict]) -> dict[str, Any]:
    """The state after appending ``points`` (steps after ``state['last_step']``, in order)."""
    if not points:
        return state
    s = dict(state)
    tail = list(s["tail"])
    first = None if s.get("first") is None else list(s["first"])
    for p in points:
        tail.append(_tail_row(p))
        acr = p.get("acr")
        if acr is None:
            continue
        s["ema"] = acr if s["ema"] is None else s["ema"] + EMA_ALPHA * (acr - s["ema"])
        s["streak"] = s["streak"] + 1 if acr > DEFAULT_STREAK_THRESHOLD else 0
        if first is not None and len(first) < 100:
            first.append(acr)
            if len(first) == 100:
                s["acr_100"] = math.fsum(first) / 100
    s["tail"] = tail[-TAIL:]
    s["first"] = first
    acrs = [row[2] for row in s["tail"] if row[2] is not None]
    if len(acrs) == TAIL:
        s["volatility"] = sample_std(acrs)
    s["last_step"] = points[-1]["step"]
    s["latest"] = _latest(points, s.get("latest"))
    return s


# The shortest span of step times a speed is told from (s): steps sent in one batch, a few
# microseconds apart, read as 458,060 steps per minute.
MIN_SPEED_SPAN_S = 1.0


def steps_per_minute(tail: Sequence[list]) -> float | None:
    """Steps per minute over ``tail`` (rows [step, time (s since the epoch), ...]); None with
    fewer than two timed steps or when they span under MIN_SPEED_SPAN_S."""
    timed = [(row[0], row[1]) for row in tail if row[1] is not None]
    if len(timed) < 2:
        return None
    (s0, t0), (s1, t1) = timed[0], timed[-1]
    if t1 - t0 < MIN_SPEED_SPAN_S:
        return None
    return (s1 - s0) / ((t1 - t0) / 60.0)


def wasted_share(tail: Sequence[list], group_size: int | None) -> float | None:
    """Completions in collapsed groups / completions in valid groups, over the tail steps.
    The completions are the points' `n_completions`; for points stored before they carried it,
    n_valid × the run's declared group size, and None without one or when the wasted
    completions exceed that (groups larger than declared: the share would be wrong)."""
    wasted = sum(row[3] or 0 for row in tail)
    if tail and all(len(row) > 5 and row[5] is not None for row in tail):
        total = sum(row[5] for row in tail)
        return wasted / total if total else None
    if not group_size:
        return None
    total = sum((row[4] or 0) * group_size for row in tail)
    return wasted / total if total and wasted <= total else None


def cards(state: dict[str, Any], run: dict) -> list[dict[str, Any]]:
    """The KPI cards: id, title, value text, help text and a severity (ok / warn / bad, none:
    nothing to judge, info: a raw figure that a working mitigation acts on).

    Raw figures say "raw" in their titles; the effective ACR has a card of its own. Colours
    judge the figure shown: a raw figure is coloured by its own value, unless a mitigation
    holds the same step's effective ACR at or below 0.35, where a high raw figure is expected
    (AVSPO leaves the raw collapse as it is and gives those groups a gradient): it is then grey,
    neither fine nor a worry, and its sub-line says why ("Wasted rollouts 100%" in green read
    as if the waste were fine)."""
    latest = state.get("latest") or {}
    acr = latest.get("acr")
    mode = current_mitigation(run)
    effective = latest.get("acr_effective")
    # a mitigation that holds the effective ACR down: the raw cards' values are expected
    acting = mode != "none" and effective is not None and effective <= explain.STALL_THRESHOLD
    why = f"{mode.upper()} acts on it: effective {explain.fmt(effective)}" if acting else ""
    tail = state.get("tail") or []
    wasted = wasted_share(tail, run.get("group_size"))
    speed = steps_per_minute(tail)
    streak = state.get("streak") or 0

    def level(value, warn, bad):
        if value is None:
            return "none"
        return "bad" if value > bad else "warn" if value > warn else "ok"

    def raw_level(value, warn, bad):
        return "info" if acting and value is not None else level(value, warn, bad)

    # no step with an ACR (every group invalid: all-NaN rewards): "0 steps above 0.35" and "0
    # wasted" were green, as if the run were healthy
    scored = acr is not None or state.get("ema") is not None

    wasted_text = explain.fmt(None) if wasted is None else f"{explain.fmt(100 * wasted, 0)}%"
    if wasted is None and tail and scored:  # no ACR at all: no "0.0/step" either
        # Without a group size that fits the data, show completions wasted per step instead.
        wasted_text = f"{explain.fmt(sum(r[3] or 0 for r in tail) / len(tail), 1)}/step"
    wasted_sub = f"last {len(tail)} step{'' if len(tail) == 1 else 's'}"
    if why:
        wasted_sub += f"; {why}"
    cost = run.get("cost")
    if cost:
        wasted_sub += f"; whole run {cost_text(cost)[0]}"
    if mode == "none" or effective is None:
        effective_sub = "the trainer sends none" if effective is None else "no mitigation on"
    else:
        effective_sub = f"after {mode.upper()}"
    return [
        {
            "id": "acr",
            "title": "Latest ACR (raw)",
            "value": explain.fmt(acr),
            "sub": f"step {explain.fmt(latest.get('step'))}" + (f" · {why}" if why else ""),
            "help": explain.ACR,
            "level": raw_level(acr, 0.3, explain.STALL_THRESHOLD),
        },
        {
            "id": "acr_effective",
            "title": "Effective ACR",
            "value": explain.fmt(effective),
            "sub": effective_sub,
            "help": explain.KPI_HELP.get("acr_effective", EFFECTIVE_HELP),
            "level": level(effective, 0.3, explain.STALL_THRESHOLD),
        },
        {
            "id": "acr_100",
            "title": "ACR, first 100 steps (raw)",
            "value": explain.fmt(state.get("acr_100")),
            "sub": "early collapse",
            "help": explain.ACR_100,
            "level": level(state.get("acr_100"), 0.35, 0.5),
        },
        {
            "id": "acr_ema",
            "title": "ACR trend (EMA, raw)",
            "value": explain.fmt(state.get("ema")),
            "sub": f"volatility {explain.fmt(state.get('volatility'))}"
            + (f"; {why}" if why else ""),
            "help": explain.ACR_EMA,
            "level": raw_level(state.get("ema"), 0.3, explain.STALL_THRESHOLD),
        },
        {
            "id": "acr_streak",
            "title": "Steps above 0.35 (raw)",
            "value": explain.fmt(int(streak)),
            "sub": why or "stalled after 50",
            "help": explain.ACR_STREAK,
            "level": raw_level(streak, 10, 50) if scored else "none",
        },
        {
            "id": "wasted",
            "title": "Wasted rollouts (raw)",
            "value": wasted_text,
            "sub": wasted_sub,
            "help": explain.WASTED,
            "level": raw_level(wasted, 0.3, 0.5) if scored else "none",
        },
        {
            "id": "reward_mean",
            "title": "Reward mean",
            "value": explain.fmt(latest.get("reward_mean"), 3),
            "sub": f"pass rate {explain.fmt(latest.get('pass_rate'))}",
            "help": explain.REWARD_MEAN,
            "level": "none",
        },
        {
            "id": "steps_per_min",
            "title": "Steps per minute",
            "value": explain.fmt(speed, 1),
            "sub": run.get("status", ""),
            "help": explain.KPI_HELP["steps_per_min"],
            "level": "bad" if run.get("status") in ("stale", "failed") else "none",
        },
    ]


EFFECTIVE_HELP = (
    "Effective ACR: the share of valid groups whose advantages are still all zero after the "
    "trainer's mitigation (AVSPO, AAPO or DAPO), as the trainer reports it. This is what the "
    "policy cannot learn from; the raw ACR beside it counts every collapsed group, which a "
    "mitigation leaves as it is. At or below 0.35 is fine."
)


def kpi_cards(cards: list[dict]) -> list[html.Div]:
    """The cards of `cards` as components, each titled with its help text."""
    return [
        html.Div(
            [
                html.Div(c["title"], className="kpi-title"),
                html.Div(c["value"], className="kpi-value", id=f"kpi-{c['id']}-value"),
                html.Div(c["sub"], className="kpi-sub"),
            ],
            className=f"kpi kpi-{c['level']}",
            title=c["help"],
            id=f"kpi-{c['id']}",
        )
        for c in cards
    ]
