"""What operators and clients ask of the service itself: /v1/models, /health, /version, /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from ... import __version__
from .. import schema
from ..guards import check_auth, server_state
from ..metrics import CONTENT_TYPE, render

router = APIRouter()


@router.api_route("/v1/models", methods=["GET", "HEAD"],
                  responses={200: {"model": schema.ModelList}, 401: {"model": schema.ErrorResponse}})
async def models(req: Request):
    check_auth(req)
    state = server_state(req)
    card = {"id": state.served_name, "object": "model", "created": 0, "owned_by": "tailgate",
            "max_model_len": state.cfg.max_context if state.cfg and state.cfg.max_context else None}
    return JSONResponse({"object": "list", "data": [card]})


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(req: Request):
    state = server_state(req)
    if not state.ready:
        return JSONResponse({"status": "loading" if not state.load_error else state.load_error}, status_code=503)
    if state.engine.error is not None:
        return JSONResponse({"status": f"engine failed: {state.engine.error}"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.api_route("/version", methods=["GET", "HEAD"])
async def version(req: Request):
    return JSONResponse({"version": __version__, "kernels": server_state(req).kernels})


@router.api_route("/metrics", methods=["GET", "HEAD"])
async def metrics(req: Request):
    return Response(render(req.app.state.registry), media_type=CONTENT_TYPE)
