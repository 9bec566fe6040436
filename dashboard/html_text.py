"""Dash html components as one HTML text, for a big table that the page shows through a single
`dcc.Markdown` component.

Dash renders each component of a callback's answer as a React component of its own, tied to
its store: the runs list's 50 rows (about 1,200 components) took seconds to appear in
Chromium, where the same table as one component's HTML took tens of milliseconds. Every text
and attribute value is escaped here (`html.escape`), so run names, projects and tags stay text.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

# Dash property -> HTML attribute (others: data-* and aria-* as they are)
_ATTRIBUTES = {"className": "class", "id": "id", "title": "title", "src": "src", "alt": "alt"}
_VOID = {"img", "br", "hr"}
# The dashboard's own drawings (`pages.runs.table.sparkline_svg`, built from numbers only)
_SVG_URI = "data:image/svg+xml;base64,"


def _text(value: Any) -> str:
    # one line: a blank line would end the HTML block that Markdown passes through as it is
    return escape(str(value), quote=True).replace("\n", "&#10;").replace("\r", "&#13;")


def to_html(component: Any) -> str:
    """``component`` (Dash html components, `dcc.Link`, text, numbers, lists, None) as HTML
    text; a `dcc.Link` becomes an ``<a href>``, an image of an SVG data URI that SVG inline.
    Raises TypeError for anything else (a
    component this cannot write would vanish silently)."""
    if component is None:
        return ""
    if isinstance(component, str | int | float):
        return _text(component)
    if isinstance(component, list | tuple):
        return "".join(to_html(c) for c in component)
    namespace = getattr(component, "_namespace", None)
    kind = getattr(component, "_type", None)
    if namespace == "dash_core_components" and kind == "Link":
        tag = "a"
    elif namespace == "dash_html_components":
        tag = kind.lower()
    else:
        raise TypeError(f"to_html cannot write a {namespace}.{kind}")
    # a component keeps its properties as attributes (to_plotly_json walks every attribute
    # name against the wildcard prefixes: most of this function's time)
    wire = {k: v for k, v in vars(component).items() if not k.startswith("_")}
    src = str(wire.get("src") or "")
    if tag == "img" and src.startswith(_SVG_URI):
        # Markdown drops a data: image, and with it the whole table: the SVG goes inline
        svg = base64.b64decode(src[len(_SVG_URI) :]).decode()
        title = _text(wire.get("title") or wire.get("alt") or "")
        return f'<span class="inline-svg" role="img" title="{title}">{svg}</span>'
    attrs = []
    for name, value in wire.items():
        if name == "children" or value is None:
            continue
        attr = "href" if name == "href" else _ATTRIBUTES.get(name)
        if attr is None and name.startswith(("data-", "aria-")):
            attr = name
        if attr is not None:
            attrs.append(f' {attr}="{_text(value)}"')
    opening = f"<{tag}{''.join(attrs)}>"
    if tag in _VOID:
        return opening
    return f"{opening}{to_html(wire.get('children'))}</{tag}>"
