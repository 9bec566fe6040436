"""A malformed callback request gets 400 naming what is wrong, not Dash's 500.

Dash's callback route (``POST /dashboard/_dash-update-component``) trusts its body: a body that
is not JSON, lacks ``output``, names no callback of this app, or carries fewer inputs than the
callback declares raised inside Dash and answered 500. The
browser never sends such a body, so this check refuses only what a script or a fuzzer sends.
"""

from __future__ import annotations

from typing import Any

import orjson
from dash import Dash
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _Prop(BaseModel):
    """One input, state or output: a component's id and property (and, for inputs, value)."""

    model_config = ConfigDict(extra="allow")
    id: str | dict[str, Any]
    property: str


class _Callback(BaseModel):
    """The fields of a callback request that Dash reads before it calls the callback."""

    model_config = ConfigDict(extra="allow")
    output: str
    outputs: _Prop | list[_Prop | list[_Prop]]
    inputs: list[_Prop | list[_Prop]]
    state: list[_Prop | list[_Prop]] = []
    changedPropIds: list[str] = []  # noqa: N815 - Dash's field name


class CallbackRequests:
    """ASGI middleware: checks each POST to ``dash_app``'s callback route against the app's
    callbacks before Dash reads it; a bad one gets 400 with a JSON ``detail`` (the server's
    ``BodyLimit``, outside it, answers a body past 8 MiB with 413)."""

    def __init__(self, app: ASGIApp, dash_app: Dash) -> None:
        self.app = app
        self.dash_app = dash_app
        self.path = dash_app.config.routes_pathname_prefix + "_dash-update-component"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            return await self.app(scope, receive, send)
        body = await _read(receive)
        problem = self.problem(body)
        if problem:
            detail = f"not a callback request of this dashboard: {problem}"
            return await JSONResponse({"detail": detail}, 400)(scope, receive, send)
        await self.app(scope, _replay(body, receive), send)

    def problem(self, body: bytes) -> str | None:
        """What is wrong with a callback request's body, or None when Dash can read it."""
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return "the body is not JSON"
        if not isinstance(parsed, dict):
            return f"the body must be a JSON object, not {type(parsed).__name__}"
        try:
            request = _Callback.model_validate(parsed)
        except ValidationError as exc:
            first = exc.errors()[0]
            return f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}"
        callback = self.dash_app.callback_map.get(request.output)
        if callback is None:
            return f"no callback has the output {request.output[:200]!r}"
        if "callback" not in callback:  # a clientside callback: Dash has nothing to call
            return f"the output {request.output[:200]!r} is computed in the browser"
        declared = len(callback["inputs"]) + len(callback["state"])
        sent = len(request.inputs) + len(request.state)
        if sent != declared:
            return f"the callback takes {declared} inputs and states; {sent} were sent"
        return self._value_problem([*request.inputs, *request.state])

    def _value_problem(self, props: list[_Prop | list[_Prop]]) -> str | None:
        """What is wrong with a value that the browser always sends as text (a number for a run
        id, or an address outside the dashboard for Dash Pages' router, was a 500)."""
        prefix = self.dash_app.config.requests_pathname_prefix.rstrip("/")
        for prop in _flat(props):
            if not isinstance(prop.id, str) or (prop.id, prop.property) not in _TEXT:
                continue
            value, name = (prop.model_extra or {}).get("value"), f"{prop.id}.{prop.property}"
            if not isinstance(value, str) and not (value is None and _TEXT[prop.id, prop.property]):
                return f"{name} must be text, not {type(value).__name__}"
            if name == "_pages_location.pathname" and not value.startswith(prefix):
                return f"{name} must be an address under {prefix}/"
        return None


# Values sent as text, and whether null is one of them: the run page's run id, the id a page
# of a run not yet registered waits for, and the address Dash Pages routes.
_TEXT = {
    ("run-id", "data"): False,
    ("run-wait-id", "data"): False,
    ("_pages_location", "pathname"): False,
    ("_pages_location", "search"): True,
}


def _flat(props: list[_Prop | list[_Prop]]) -> list[_Prop]:
    """The props of a request, pattern-matching ones (a list per id pattern) included."""
    return [p for item in props for p in (item if isinstance(item, list) else [item])]


async def _read(receive: Receive) -> bytes:
    """The whole request body (what a client that went away sent of it)."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then ``receive``'s messages (a
    disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
