"""The FastAPI app: one APIRouter per concern (`routes/`), errors as OpenAI error bodies, the
engine's summary at shutdown, `/openapi.json` with the request schemas the routes validate
against, and the Host check in front."""
from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from .. import __version__
from . import schema
from .metrics import registry_for
from .protocol import ApiError
from .routes import generation, service, tokenize
from . import web
from .state import ServerState

__all__ = ["ServerState", "create_app"]
log = logging.getLogger("tailgate.server")


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@contextlib.asynccontextmanager
async def _lifespan(app):
    yield
    # Uvicorn re-raises SIGTERM once it has shut down, so nothing after server.run() runs:
    # say here what the engine did, for runs whose /metrics nobody scraped (bench ab's logs).
    state = app.state.tailgate
    if state.engine is not None:
        m = state.engine.snapshot.metrics
        logging.getLogger("tailgate").info(
            "stopping after %d steps: door releases %s, %d held (mean %.1f ms), prefix cache hits %d of %d "
            "prompt tokens, %d preemptions, %d lane prefills", m.steps, dict(m.door_releases), m.door_hold.n,
            1000 * m.door_hold.total / max(1, m.door_hold.n), m.prefix_hits, m.prefix_queries, m.preemptions,
            m.lane_prefills)


def _openapi(app: FastAPI):
    def build() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            comps = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in schema.REQUESTS:
                s = model.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(s.pop("$defs", {}))
                comps[model.__name__] = s
            app.openapi_schema = doc
        return app.openapi_schema
    return build


def create_app(state: ServerState):
    # Every route raises ApiError for what a client did wrong; one handler turns it into the body.
    app = FastAPI(title="tailgate", version=__version__, docs_url=None, redoc_url=None, lifespan=_lifespan,
                  exception_handlers={ApiError: lambda req, exc: _error(exc), HTTPException: lambda req, exc: _error(
                      ApiError(exc.status_code, f"{req.method} {req.url.path}: {exc.detail}")),
                      Exception: lambda req, exc: _error(ApiError(500, f"internal error: {exc!r}"))})
    app.state.tailgate = state
    app.state.registry = registry_for(state)
    for module in (generation, tokenize, service):
        app.include_router(module.router)
    app.include_router(web.router)  # the playground and the dashboard (docs/web.md)
    app.openapi = _openapi(app)
    return HostCheck(app, state.allowed_hosts) if state.allowed_hosts is not None else app


class HostCheck:
    """Refuse requests whose Host header names another server (DNS rebinding against a loopback
    server), with an OpenAI error body. Starlette's TrustedHostMiddleware does the same check but
    answers in plain text, which the API promises never to do."""

    def __init__(self, app, allowed: frozenset):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.strip("[]").lower() not in self.allowed:
                resp = _error(ApiError(421, f"Host {host!r} is not served here (tailgate serve --allowed-hosts)"))
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)
