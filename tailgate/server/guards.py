"""What every route checks before it does work: the API key, the body (read and bounded by hand,
see `read_body`), that the model is serving, and that the named model is the one served; plus the
OpenAPI pieces the routes that parse their own body publish.

The generation routes read their body themselves instead of letting FastAPI parse it: the body
is bounded while it streams in (413), Python's JSON parser must be told that NaN and Infinity are
not JSON, and every failure has to be an OpenAI error body rather than FastAPI's 422 shape. Their
request schemas are still published (`openapi_body`), from the same pydantic models that validate
them (`schema.py`).
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request

from . import schema
from .protocol import ApiError, bad
from .state import ServerState


def server_state(req: Request) -> ServerState:
    """The ServerState that `create_app` hung on the app (one per app, so tests can run several)."""
    return req.app.state.tailgate


def _no_constant(name: str):
    """Python's JSON parser accepts NaN and Infinity; JSON and the OpenAI API do not."""
    raise bad(f"malformed JSON body: {name} is not a JSON number")


def openapi_body(model) -> dict:
    """OpenAPI for a route that parses its own body as `model`."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


ERRORS = {code: {"model": schema.ErrorResponse} for code in (400, 401, 413, 415, 429, 503)}


async def read_body(req: Request, state: ServerState) -> dict:
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":  # a browser's cross-site text/plain POST must not run work
        raise ApiError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
    declared = req.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > state.max_body_bytes:
        raise ApiError(
            413,
            f"request body of {declared} bytes exceeds the server's {state.max_body_bytes} "
            "(tailgate serve --max-body-mb)",
        )
    raw = bytearray()
    async for part in req.stream():  # a chunked body without Content-Length is bounded too
        raw += part
        if len(raw) > state.max_body_bytes:
            raise ApiError(
                413, f"request body exceeds the server's {state.max_body_bytes} bytes (tailgate serve --max-body-mb)"
            )
    try:
        body = json.loads(bytes(raw), parse_constant=_no_constant)
        json.dumps(body, ensure_ascii=False).encode("utf-8")  # lone surrogates ("\\ud800") cannot
    except RecursionError:
        raise bad("malformed JSON body: nested too deeply")
    except ValueError as e:  # bad JSON, bad UTF-8, lone surrogates, integers past 4300 digits
        raise bad(f"malformed JSON body: {e}")
    if not isinstance(body, dict):
        raise bad("the JSON body must be an object")
    return body


def check_key(authorization: str, api_key: str | None) -> None:
    """An ApiError (401) unless the Authorization header carries the key (none set: anything)."""
    if api_key is not None and not hmac.compare_digest(authorization.encode(), f"Bearer {api_key}".encode()):
        raise ApiError(401, "invalid or missing API key", code="invalid_api_key")


def check_auth(req: Request) -> None:
    check_key(req.headers.get("authorization", ""), server_state(req).api_key)


def check_ready(state: ServerState) -> None:
    if not state.ready:
        raise ApiError(503, state.load_error or "the model is still loading")
    if state.engine.error is not None:
        raise ApiError(503, f"engine failed: {state.engine.error!r}; the server is exiting")


def check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name not in (state.served_name, "default"):
        raise ApiError(400, f"The model `{name}` does not exist.", "model", code="model_not_found")


async def admitted_body(req: Request) -> dict:
    """What every POST route checks first, in this order: the key, the body (a bad body is a 400
    even while loading), then that the model is serving."""
    check_auth(req)
    state = server_state(req)
    body = await read_body(req, state)
    check_ready(state)
    return body
