"""One router module per resource of docs/design.md §4."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from ..errors import field_error, plain_body_errors

T = TypeVar("T", bound=BaseModel)


async def read_body(request: Request) -> bytes:
    """The request body (``middleware.BodyLimit`` has refused one past MAX_REQUEST_BYTES with 413
    while it was read); 400 when the client goes away before sending all of it."""
    try:
        return await request.body()
    except ClientDisconnect:  # nobody is left to answer; stored nothing, logs no traceback
        raise HTTPException(400, "the client went away before sending the whole body") from None


def parse_body(model: type[T], raw: bytes) -> T:
    """Validate a raw JSON body with ``model`` (422 listing the errors, without the inputs:
    they may hold NaN, which a JSON answer cannot carry). Each ``loc`` starts with "body", as
    in the errors of the bodies FastAPI validates itself."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
        raise HTTPException(422, plain_body_errors(errors)) from exc


def json_response(content: Any, status_code: int = 200) -> Response:
    """orjson-encoded answer (fast for large metric series; non-finite floats become null)."""
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


# Models whose bodies are read raw (for speed) still document their schema; their nested
# definitions are collected here and added to the OpenAPI components by `document_raw_bodies`.
EXTRA_SCHEMAS: dict[str, Any] = {}


def raw_body_openapi(model: Any) -> dict[str, Any]:
    """``openapi_extra`` that documents a raw-read JSON body as ``model``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    EXTRA_SCHEMAS.update(schema.pop("$defs", {}))
    EXTRA_SCHEMAS[model.__name__] = schema
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def document_raw_bodies(app: FastAPI) -> None:
    """Add the raw-read bodies' schemas (`EXTRA_SCHEMAS`) and the bearer key to ``app``'s
    OpenAPI document."""
    base_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = base_openapi()
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(EXTRA_SCHEMAS)
            # The key as a bearer token, so that /docs has an Authorize button and its "Try it
            # out" sends the key (the routes read the header themselves).
            components["securitySchemes"] = {
                "APIKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A key from `vantage keys create` (vtg_…). /healthz, "
                    "/readyz, /docs and /openapi.json need none.",
                }
            }
            schema["security"] = [{"APIKey": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def known_query_only(request: Request) -> None:
    """Refuse a GET whose query names a parameter its route does not take (422, each unknown
    name as pydantic's ``extra_forbidden`` at ``["query", name]``), as ``GET /runs`` and
    ``GET /alerts`` do with their filter models: ``prompts?sid=all_pass`` listed every side,
    ``export.csv?splt=eval`` every split. A parameter that takes one value and is
    given several times is refused too (``?project=a&project=b`` answered project b's runs),
    and so is a value with a NUL character, on every database.
    A route's parameters are those its OpenAPI operation lists; a route outside the schema is
    left alone. Async: no thread hop."""
    if request.method != "GET" or not request.query_params:
        return
    path = getattr(request.scope.get("route"), "path_format", None)
    operation = request.app.openapi()["paths"].get(path, {}).get("get")
    if operation is None:
        return
    known = {p["name"]: p for p in operation.get("parameters", ()) if p["in"] == "query"}
    errors = []
    for name in dict.fromkeys(request.query_params):
        values = request.query_params.getlist(name)
        if name not in known:
            errors.append(field_error(_EXTRA_MSG, ["query", name], "extra_forbidden"))
        elif len(values) > 1 and not _many(known[name]):
            msg = f"given {len(values)} times; {name} takes one value"
            errors.append(field_error(msg, ["query", name], "repeated_parameter"))
        elif any("\x00" in value for value in values):
            # PostgreSQL refuses it (422) where SQLite matches nothing (200)
            msg = "cannot contain NUL characters"
            errors.append(field_error(msg, ["query", name]))
    if errors:
        raise RequestValidationError(errors)


_EXTRA_MSG = "Extra inputs are not permitted"


def _many(parameter: dict[str, Any]) -> bool:
    """Whether an OpenAPI query parameter takes a list (may be given several times)."""
    schema = parameter.get("schema", {})
    return any(s.get("type") == "array" for s in (schema, *schema.get("anyOf", ())))
