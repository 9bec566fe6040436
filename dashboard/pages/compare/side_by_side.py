"""The compare page's side-by-side tables: a column per run, a row per figure (steps, pooled
ACRs, wasted rollouts, the last reward, ...), and the config keys whose values differ between
the runs (nested keys flattened as ``a.b.c``). Builders are pure: data in, Dash components out."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from dash import dcc, html
from vantage.dashboard import components, explain

MISSING = object()  # a key one run's config lacks


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A run's config as ``{"a.b.c": value}``: nested mappings flattened with dots, any other
    value (a list too) kept whole; a config that is no mapping (None) is empty."""
    if not isinstance(config, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_diff(configs: Sequence[Any]) -> tuple[list[tuple[str, list[Any]]], int]:
    """The keys whose values differ between ``configs`` (one per run, in order), each with its
    value per run (`MISSING` where a run's config lacks it), sorted by key; and how many keys
    all of them share with one value."""
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f})
    differ, same = [], 0
    for key in keys:
        values = [f.get(key, MISSING) for f in flat]
        texts = {_canonical(v) for v in values}
        if len(texts) > 1:
            differ.append((key, values))
        else:
            same += 1
    return differ, same


def _canonical(value: Any) -> str:
    if value is MISSING:
        return "\x00missing"
    return json.dumps(value, sort_keys=True, default=str)


def shown_value(value: Any) -> str:
    """A config value in a cell: text as it is, other JSON compactly, "—" when missing."""
    if value is MISSING:
        return "—"
    if isinstance(value, str):
        return explain.visible(value)
    return json.dumps(value, default=str)


def _run_heads(runs: Sequence[dict]) -> list:
    return [
        html.Th(
            dcc.Link(r.get("name") or r["run_id"][:8], href=components.run_href(r["run_id"])),
            className="wrap",
        )
        for r in runs
    ]


def config_table(runs: Sequence[dict]) -> html.Div:
    """The config keys that differ between ``runs`` (their ``config``), a column per run."""
    differ, same = config_diff([r.get("config") for r in runs])
    if len(runs) < 2:
        note = "Choose two runs or more to see how their configs differ."
        return html.Div([html.H4("Config differences"), html.P(note, className="muted")])
    if not differ:
        said = f"The runs' configs are the same ({same:,} keys)."
        return html.Div([html.H4("Config differences"), html.P(said, className="muted")])
    head = html.Tr([html.Th("key"), *_run_heads(runs)])
    rows = [
        html.Tr(
            [html.Td(explain.visible(key), className="wrap"),
             *(html.Td(shown_value(v), className="wrap") for v in values)]
        )
        for key, values in differ
    ]  # fmt: skip
    note = f"{len(differ):,} keys differ; {same:,} are the same in every run (not shown)."
    return html.Div(
        [
            html.H4("Config differences"),
            html.P(note, className="muted"),
            html.Table([html.Thead(head), html.Tbody(rows)], className="runs", id="compare-config"),
        ]
    )


def _last_reward(points: Sequence[dict]) -> Any:
    """The reward mean of the newest step that has one."""
    return next((p["reward_mean"] for p in reversed(points) if p.get("reward_mean") is not None),
                None)  # fmt: skip


Getter = Callable[[dict, dict, dict, Sequence[dict]], Any]  # run, window, totals, points
METRIC_ROWS: list[tuple[str, str, Getter, int]] = [
    ("steps", "Training steps stored.", lambda r, w, t, p: t.get("steps"), 0),
    ("last step", "The newest step.", lambda r, w, t, p: r.get("last_step"), 0),
    ("ACR pooled", "Collapsed groups / valid groups over the whole run (raw: before any "
     "mitigation).", lambda r, w, t, p: w.get("acr_pooled"), 3),
    ("effective ACR pooled", "Zero-advantage groups left after AVSPO/AAPO, pooled over the run "
     "(each step's effective ACR weighted by its valid groups); — when the trainer sends no "
     "effective statistics.", lambda r, w, t, p: t.get("acr_effective_pooled"), 3),
    ("latest ACR", "The raw ACR of the newest step that has one.",
     lambda r, w, t, p: r.get("latest_acr"), 3),
    ("ACR first 100", explain.ACR_100, lambda r, w, t, p: w.get("acr_100"), 3),
    ("wasted rollouts", "Completions in collapsed groups over the run: compute that taught "
     "plain GRPO nothing.", lambda r, w, t, p: t.get("wasted_rollouts"), 0),
    ("wasted share", "Wasted rollouts / completions in valid groups.",
     lambda r, w, t, p: t.get("wasted_share"), 3),
    ("wasted GPU-hours", "GPUs (the config's `gpus`) × the step time (`step_s`) spent on wasted "
     "rollouts; — without both.", lambda r, w, t, p: t.get("wasted_gpu_hours"), 2),
    ("last reward mean", "Mean reward of the newest step that has one.",
     lambda r, w, t, p: _last_reward(p), 3),
]  # fmt: skip


def metrics_table(result: dict) -> html.Table:
    """``data.compare``'s runs side by side: a column per run, a row per `METRIC_ROWS` figure,
    and the mitigation in effect."""
    runs = result["runs"]
    rows = []
    for label, help_text, get, digits in METRIC_ROWS:
        cells = []
        for run in runs:
            rid = run["run_id"]
            value = get(run, result["windows"].get(rid) or {}, (result.get("totals") or {}).get(rid)
                        or {}, result["metrics"].get(rid) or [])  # fmt: skip
            cells.append(html.Td(explain.fmt(value, digits) if digits else explain.fmt(value)))
        rows.append(html.Tr([html.Th(label, title=help_text), *cells]))
    mitigation = [html.Td(components.mitigation_text(r)[0]) for r in runs]
    rows.append(html.Tr([html.Th("mitigation", title="The mitigation in effect."), *mitigation]))
    head = html.Tr([html.Th("run"), *_run_heads(runs)])
    return html.Table([html.Thead(head), html.Tbody(rows)], className="runs", id="compare-side")
