"""What operators and clients ask of the service itself: /v1/models, /health, /version, /metrics.
Each answers HEAD as GET does; the HEAD routes stay out of the schema (one operation a path)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ... import __version__
from .. import schema
from ..guards import check_auth, server_state
from ..metrics import CONTENT_TYPE, render

router = APIRouter()


def get_and_head(path: str, **doc):
    """Register a GET route (documented) and the same handler for HEAD (not)."""

    def register(fn):
        router.get(path, **doc)(fn)
        router.head(path, include_in_schema=False)(fn)
        return fn

    return register


@get_and_head("/v1/models", responses={200: {"model": schema.ModelList}, 401: {"model": schema.ErrorResponse}})
async def models(req: Request):
    check_auth(req)
    state = server_state(req)
    card = {
        "id": state.served_name,
        "object": "model",
        "created": 0,
        "owned_by": "tailgate",
        "max_model_len": state.cfg.max_context if state.cfg and state.cfg.max_context else None,
    }
    return JSONResponse({"object": "list", "data": [card]})


@get_and_head("/health", responses={503: {"description": "loading, or the engine failed (the server is exiting)"}})
async def health(req: Request):
    state = server_state(req)
    if not state.ready:
        return JSONResponse({"status": "loading" if not state.load_error else state.load_error}, status_code=503)
    if state.engine.error is not None:
        return JSONResponse({"status": f"engine failed: {state.engine.error}"}, status_code=503)
    return JSONResponse({"status": "ok"})


@get_and_head("/version")
async def version(req: Request):
    """The package version, the served model and what it is good for, the kernels this CPU runs
    (and what the probe measured), the KV cache (MiB, tokens, the rule that sized it), and the
    scheduler's knobs as resolved (flags, env vars, config file, defaults)."""
    state = server_state(req)
    knobs = asdict(state.cfg) if state.cfg is not None else {}
    kv = getattr(state.engine, "kv", None) if state.ready else None
    body = {"version": __version__, "model": state.model_card, "kernels": state.kernels, "kv_cache": kv}
    return JSONResponse({**body, "knobs": knobs})


@get_and_head(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Prometheus text exposition format 0.0.4",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(req: Request):
    return Response(render(req.app.state.registry), media_type=CONTENT_TYPE)
