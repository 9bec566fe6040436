"""The compare page's table: each chosen run's numbers at the last step every one of them
reached, and its window metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import dcc, html
from vantage.dashboard import components, explain

COMMON_COLUMNS = [
    ("acr", "ACR", explain.ACR),
    ("acr_effective", "effective ACR", explain.ACR_EFFECTIVE),
    ("reward_mean", "reward", "Mean reward of the step's completions."),
    ("eval_accuracy", "eval accuracy", "Held-out accuracy, as the trainer logs it (the "
     "`eval_accuracy` scalar), with the step it was measured at when that is an earlier "
     "one; — when it logs none."),
]  # fmt: skip
COMMON_STEP = (
    "Taken at the last step every chosen run reached (its newest point by then), so that the "
    "runs compare at the same step."
)
WINDOW_COLUMNS = [
    ("acr_pooled", "ACR pooled", "Collapsed groups / valid groups over the whole run."),
    ("acr_100", "ACR first 100", explain.ACR_100),
    ("acr_ema", "ACR EMA", explain.ACR_EMA),
    ("acr_volatility", "ACR volatility", "Std of the last 25 step ACRs: a jumpy run is unstable."),
    ("acr_streak", "current streak > 0.35", explain.ACR_STREAK),
]


def at_common_step(metrics: dict[str, Sequence[dict]]) -> tuple[int | None, dict[str, dict]]:
    """Runs' numbers at the last step every one of them reached, so that they compare like for
    like (their latest values were at steps 80 and 193). ``metrics``: run id → its
    points (step order, maybe downsampled). Returns (that step, run id → {acr, acr_effective,
    reward_mean, eval_accuracy, eval_accuracy_step}), each from the run's newest point at or
    before the step; eval_accuracy is the newest `eval_accuracy` scalar by then (the bundled
    trainer's held-out accuracy) and eval_accuracy_step the step it was logged at. A run
    without points is left out of the step, its values None (one such run blanked every
    run's); (None, {}) when no run has points."""
    stepped = {run_id: points for run_id, points in metrics.items() if points}
    if not stepped:
        return None, {}
    common = min(points[-1]["step"] for points in stepped.values())
    out = {run_id: dict.fromkeys(("acr", "acr_effective", "reward_mean", "eval_accuracy",
                                  "eval_accuracy_step"))
           for run_id in metrics}  # fmt: skip
    for run_id, points in stepped.items():
        before = [p for p in points if p["step"] <= common]
        point = before[-1] if before else {}
        measured = next(
            (
                p
                for p in reversed(before)
                if isinstance((p.get("scalars") or {}).get("eval_accuracy"), int | float)
            ),
            None,
        )
        out[run_id] = {
            **{k: point.get(k) for k in ("acr", "acr_effective", "reward_mean")},
            "eval_accuracy": measured["scalars"]["eval_accuracy"] if measured else None,
            "eval_accuracy_step": measured["step"] if measured else None,
        }
    return common, out


def common_cell(values: dict[str, Any], key: str, common: int | None) -> str:
    """A compare table cell of `at_common_step`'s ``values``: the number, and for the held-out
    accuracy, measured every few steps, the step it was measured at when not ``common`` (the
    column said "at step 80" of an accuracy from step 77)."""
    text = explain.fmt(values.get(key))
    at = values.get(f"{key}_step")
    return f"{text} (step {at})" if at is not None and at != common else text


def comparison_table(result: dict) -> html.Table:
    """The table of ``data.compare``'s result (at least one run): a row per run, its numbers at
    the last step every run reached, its window metrics and its CSV export."""
    common, at = at_common_step(
        {r["run_id"]: result["metrics"].get(r["run_id"]) or [] for r in result["runs"]}
    )
    when = f"at step {common}" if common is not None else "at a common step"
    head = html.Tr(
        [html.Th("run"), html.Th("mitigation"), html.Th("last step")]
        + [html.Th(f"{label} {when}", title=f"{help_text} {COMMON_STEP}")
           for _k, label, help_text in COMMON_COLUMNS]
        + [html.Th(label, title=help_text) for _k, label, help_text in WINDOW_COLUMNS]
        + [html.Th("CSV")]
    )  # fmt: skip
    rows = []
    for run in result["runs"]:
        window = result["windows"].get(run["run_id"], {})
        values = at.get(run["run_id"], {})
        mit, mit_help = components.mitigation_text(run)
        rows.append(
            html.Tr(
                [
                    html.Td(
                        dcc.Link(
                            run.get("name") or run["run_id"][:8],
                            href=components.run_href(run["run_id"]),
                        ),
                        className="wrap",
                    ),
                    html.Td(mit, title=mit_help),
                    html.Td(explain.fmt(run.get("last_step"))),
                ]
                + [
                    html.Td(
                        common_cell(values, k, common),
                        className=components.acr_class(values.get(k))
                        if k.startswith("acr")
                        else "",
                    )
                    for k, _l, _h in COMMON_COLUMNS
                ]
                + [
                    html.Td(
                        explain.fmt(window.get(k))
                        if k != "acr_streak"
                        else explain.fmt(window.get(k), 0)
                    )
                    for k, _l, _h in WINDOW_COLUMNS
                ]
                + [
                    html.Td(
                        html.A(
                            "metrics",
                            href=f"/dashboard/export/{run['run_id']}/metrics.csv",
                            download="",
                        )
                    )
                ]
            )  # fmt: skip
        )
    table = html.Table([html.Thead(head), html.Tbody(rows)], className="runs", id="compare-tbl")
    return table
