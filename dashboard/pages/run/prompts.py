"""The run page's Prompts tab: the prompts whose groups collapsed most often."""

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
    )
    return shown
