"""ASGI middlewares of every request: HEAD as GET, JSON bodies, and the body size limit."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from vantage.client.schema import MAX_REQUEST_BYTES


class HeadAsGet:
    """ASGI middleware: a HEAD request is routed as a GET and answered without its body
    (RFC 9110 §9.3.2), so every GET route takes HEAD (FastAPI's routes take only the methods
    they name; health checks and link checkers send HEAD)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class BodyTooLarge(HTTPException):
    """A request body past MAX_REQUEST_BYTES, raised while it is read (413)."""

    def __init__(self) -> None:
        super().__init__(413, f"request body over the limit of {MAX_REQUEST_BYTES:,} bytes")


class BodyLimit:
    """ASGI middleware: no request body past MAX_REQUEST_BYTES (docs/design.md §4), on every route.
    A declared ``Content-Length`` over it is refused before anything is read, and one within it
    passes untouched (the HTTP server delivers no more than declared: ingest's path, where the
    client always declares it, pays nothing); a body sent in chunks raises BodyTooLarge from
    ``receive`` once past the limit, which a route answers as its 413 and this middleware
    answers when a middleware was reading (nothing was stored either way)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        for k, v in scope["headers"]:
            if k == b"content-length" and v.isdigit():
                if int(v) > MAX_REQUEST_BYTES:
                    return await _too_large(scope, receive, send)
                return await self.app(scope, receive, send)
        size, started = 0, False

        async def limited() -> dict:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > MAX_REQUEST_BYTES:
                raise BodyTooLarge
            return message

        async def watched(message: dict) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except BodyTooLarge:
            if started:
                raise
            await _too_large(scope, receive, send)


async def _too_large(scope: dict, receive: Any, send: Any) -> None:
    detail = BodyTooLarge().detail
    await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


class JsonBodies:
    """ASGI middleware for API requests' bodies, which are always JSON:
    - a ``Content-Encoding`` (gzip, say) gets 415 naming it; the API reads plain JSON, and
      would otherwise answer "invalid JSON";
    - a body sent with another or no ``Content-Type`` (``curl -d`` sends a form's) is read as
      JSON all the same, as the raw-read ingest routes always did; FastAPI would otherwise
      answer a puzzling "Input should be a valid dictionary"."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            # a scan of the few headers, no dict: this runs on every ingest request
            encoding, content_type = b"", None
            for k, v in scope["headers"]:
                if k == b"content-encoding":
                    encoding = v.strip().lower()
                elif k == b"content-type":
                    content_type = v
            if encoding not in (b"", b"identity"):
                detail = (
                    f"Content-Encoding {encoding.decode('latin-1')} is not supported; "
                    "send the JSON body uncompressed"
                )
                response = JSONResponse({"detail": detail}, status_code=415)
                return await response(scope, receive, send)
            has_body = scope["method"] in ("POST", "PUT", "PATCH")  # a GET needs no rewrite
            if has_body and (content_type is None or b"json" not in content_type.lower()):
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        return await self.app(scope, receive, send)
