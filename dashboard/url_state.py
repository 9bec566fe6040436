"""A page's filters kept in its address (``?project=…&tag=…``), so that a filtered view can be
bookmarked, reloaded and sent to a colleague. The page reads them in its ``layout``; this keeps
the address current as they change, in the browser, with ``history.replaceState``: Dash's
router does not see the change, so the page is not rendered again."""

from __future__ import annotations

import json

from dash import Input, Output, clientside_callback, dcc

_SYNC = """
function(...values) {
    const names = %s;
    const params = new URLSearchParams(window.location.search);
    names.forEach((name, i) => {
        const v = values[i];
        const empty = v === null || v === undefined || v === "" || (Array.isArray(v) && !v.length);
        if (empty) { params.delete(name); }
        else { params.set(name, Array.isArray(v) ? v.join(",") : String(v)); }
    });
    const query = params.toString();
    const address = window.location.pathname + (query ? "?" + query : "") + window.location.hash;
    window.history.replaceState(window.history.state, "", address);
    return window.dash_clientside.no_update;
}
"""


def keep_in_address(store_id: str, params: dict[str, str]) -> dcc.Store:
    """Register the browser-side callback that writes each component's ``value`` (``params``:
    query parameter → component id; a list value is joined with commas, an empty one removes
    its parameter) into the address; returns the Store the page must include (the callback's
    output, never written)."""
    clientside_callback(
        _SYNC % json.dumps(list(params)),
        Output(store_id, "data"),
        *(Input(component, "value") for component in params.values()),
    )
    return dcc.Store(id=store_id)


def one(value: str | list[str] | None) -> str | None:
    """A query parameter a page takes once, as its ``layout`` gets it: Dash passes a repeated
    one (``?order=a&order=b``, a hand-edited or merged link) as a list, which the page took
    for a string and answered 500. The last value counts, as the page writes it."""
    if isinstance(value, list):
        return value[-1] if value else None
    return value


def joined(value: str | list[str] | None) -> str | None:
    """A comma-separated query parameter (``?runs=a,b``) given once or repeated
    (``?runs=a&runs=b``): all its values, joined with commas."""
    if isinstance(value, list):
        return ",".join(value) if value else None
    return value


# What a callback receives is whatever the browser sent: the page's own components send these
# types, but a hand-built request to /_dash-update-component sent a list for a dropdown's value,
# text for a click count or objects for run ids, each a 500 with a traceback.


def sent_text(value: object) -> str | None:
    """A single-choice dropdown's value: text, else None (as if nothing were chosen)."""
    return value if isinstance(value, str) else None


def sent_count(value: object) -> int:
    """A click count: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def sent_texts(value: object) -> list[str]:
    """A multi-choice dropdown's values: the text items of a list, else none."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
