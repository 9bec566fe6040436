"""The run page's Prompts tab: the prompts whose groups collapsed most often, and for a
clicked prompt what the model answered (its latest completion samples, `Monitor.log_samples`)."""

from __future__ import annotations

from urllib.parse import urlencode

from dash import dash_table, dcc, html
from vantage.dashboard import data, explain


def tab(run_id: str | None) -> html.Div:
    """The Prompts tab: which side to list, the split, the CSV downloads and the table."""
    return html.Div(
        [
            html.P(
                "Prompts whose groups collapsed most often. All-pass prompts are too easy for "
                "the policy now (drop or down-weight them); all-fail prompts are too hard (move "
                "them later in a curriculum, or check their answers and the reward function).",
                className="muted",
            ),
            dcc.RadioItems(
                id="prompts-side",
                options=[
                    {"label": "all prompts, most collapsed first", "value": ""},
                    {"label": "all-pass", "value": "all_pass"},
                    {"label": "all-fail", "value": "all_fail"},
                    {"label": "constant", "value": "constant"},
                ],
                value="",
                inline=True,
            ),
            dcc.RadioItems(
                id="prompts-split",
                options=[
                    {"label": "training prompts", "value": "train"},
                    {"label": "every split (eval too)", "value": ""},
                ],
                value="train",
                inline=True,
            ),
            html.A("Download CSV", id="prompts-csv", href="", download=""),
            " · ",
            html.A(
                "Download per-step metrics CSV",
                href=f"/dashboard/export/{run_id}/metrics.csv",
                download="",
            ),
            html.Div(id="prompts-body"),
            html.Div(samples_hint(), id="prompt-samples", className="samples"),
        ],
        className="card",
    )


def csv_href(run_id: str, side: str | None, split: str | None) -> str:
    """The prompts CSV of the run, with the tab's side and split."""
    query = urlencode({k: v for k, v in (("side", side), ("split", split)) if v})
    return f"/dashboard/export/{run_id}/prompts.csv" + (f"?{query}" if query else "")


def table(rows: list[dict]) -> object:
    """The prompts table (its first 1,000 rows), or a note when no prompt ids were sent."""
    if not rows:
        return html.P("No prompt ids were sent with this run's groups.", className="muted")
    columns = [{"name": c.replace("_", " "), "id": c} for c in data.PROMPT_COLUMNS]
    for row in rows:
        row["id"] = row.get("prompt_id")  # the raw id: a clicked cell's row_id (`show_samples`)
        if isinstance(row.get("prompt_id"), str):
            row["prompt_id"] = explain.visible(row["prompt_id"])
        if row.get("collapse_rate") is not None:
            row["collapse_rate"] = round(row["collapse_rate"], 3)
    shown = dash_table.DataTable(
        id="prompts-table",
        columns=columns,
        data=rows[:1000],
        sort_action="native",
        filter_action="native",
        page_size=25,
        style_cell={"fontFamily": "system-ui", "fontSize": "0.85rem"},
        tooltip_header={
            "collapse_rate": "Share of this prompt's groups that collapsed.",
            "all_pass": "Groups where every completion passed: too easy.",
            "all_fail": "Groups where every completion failed: too hard.",
        },
        style_cell_conditional=[{"if": {"column_id": "prompt_id"}, "cursor": "pointer"}],
    )
    return shown


SAMPLES_SHOWN = 5  # a prompt's latest samples the tab shows


def samples_hint() -> html.P:
    """What the samples box says before a prompt is clicked."""
    return html.P(
        "Click a prompt in the table to see what the model answered: its latest completions "
        "and their rewards.",
        className="muted",
    )


def samples_view(prompt_id: str, samples: list[dict]) -> list:
    """ "What did the model answer?" for ``prompt_id``: its latest samples (newest step first,
    as `GET .../samples` gives them), each its step, the prompt, and every completion beside
    its reward; or how to send samples, when the run has none for this prompt."""
    title = html.H4(f"What did the model answer? Prompt {explain.visible(prompt_id)}")
    if not samples:
        return [
            title,
            html.P(
                "No completions were sent for this prompt. The trainer sends a few per step "
                "with Monitor.log_samples(step, prompt, completions, rewards, prompt_id=...): "
                "the bundled trainer and the TRL integration do so with log_samples: N in "
                "their config (N samples a step; 0, the default, sends none).",
                className="muted",
                id="prompt-samples-none",
            ),
        ]
    out = [title]
    for sample in samples[:SAMPLES_SHOWN]:
        rewards = sample.get("rewards") or []
        rows = [
            html.Tr(
                [
                    html.Td(explain.fmt(r, 3), className="reward"),
                    html.Td(html.Pre(explain.visible(text), className="completion")),
                ]
            )
            for text, r in zip(sample.get("completions") or [], rewards, strict=False)
        ]
        head = f"step {sample.get('step')}"
        if sample.get("split") not in (None, "train"):
            head += f" ({sample['split']})"
        out.append(
            html.Div(
                [
                    html.Div(head, className="sample-step"),
                    html.Pre(explain.visible(sample.get("prompt") or ""), className="prompt"),
                    html.Table(
                        [html.Thead(html.Tr([html.Th("reward"), html.Th("completion")])),
                         html.Tbody(rows)],
                        className="runs",
                    ),
                ],
                className="sample",
            )
        )  # fmt: skip
    return out
