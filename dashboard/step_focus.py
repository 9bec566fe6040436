"""A chart that shows the step an address names (``?step=N``, as the alerts page links to a
run at its alert's step): once the chart has data, its x axis is set to the steps around N, in
the browser (`Plotly.relayout`; the figures' `uirevision` keeps the range across live
updates, as it keeps a zoom)."""

from __future__ import annotations

import json

from dash import Input, Output, clientside_callback, dcc

HALF_WINDOW = 25  # steps shown on each side of the named step

_FOCUS = """
function(figure) {
    const asked = new URLSearchParams(window.location.search).get("step");
    const step = Number(asked);
    if (asked === null || asked === "" || !Number.isFinite(step)) {
        return window.dash_clientside.no_update;
    }
    const tries = {n: 0};
    const focus = () => {
        const gd = document.getElementById(%(graph)s)?.querySelector(".js-plotly-plot");
        const ready = gd && gd.data && gd.data.some(t => t.x && t.x.length);
        if (!ready) {
            if (tries.n++ < 100) { setTimeout(focus, 100); }
            return;
        }
        if (gd.dataset.focusedStep === asked) { return; }
        gd.dataset.focusedStep = asked;
        window.Plotly.relayout(gd, {"xaxis.range": [step - %(half)d, step + %(half)d]});
    };
    focus();
    return window.dash_clientside.no_update;
}
"""


def keep_step_in_view(graph_id: str, store_id: str) -> dcc.Store:
    """Register the browser-side callback that shows ``?step=`` on the graph ``graph_id``
    (whose figure has a plain step axis, `xaxis`); returns the Store the page must include
    (the callback's output, never written). Call it at a page module's top level."""
    clientside_callback(
        _FOCUS % {"graph": json.dumps(graph_id), "half": HALF_WINDOW},
        Output(store_id, "data"),
        Input(graph_id, "figure"),
    )
    return dcc.Store(id=store_id)
