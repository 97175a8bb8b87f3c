"""The FastAPI app: one APIRouter per concern (`routes/`), errors as OpenAI error bodies, the
engine's summary at shutdown, `/openapi.json` with the request schemas the routes validate
against, and the Host check in front."""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from .. import __version__
from . import schema
from .metrics import registry_for
from .protocol import ApiError
from .routes import embeddings, generation, responses, service, tokenize
from . import web
from .state import ServerState
from .structured import unwritable

__all__ = ["ServerState", "create_app"]
log = logging.getLogger("tailgate.server")


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _http_error(req, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404, 405) as OpenAI bodies; a 405 names every method the path
    takes in `Allow` (RFC 9110), over all its routes (GET and HEAD are registered apart)."""
    headers = dict(exc.headers or {})
    methods = req.app.state.methods.get(req.url.path)
    if exc.status_code == 405 and methods:
        headers["Allow"] = ", ".join(sorted(methods))
    return _error(ApiError(exc.status_code, f"{req.method} {req.url.path}: {exc.detail}", headers=headers))


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
            "prompt tokens, %d preemptions, %d lane prefills",
            m.steps,
            dict(m.door_releases),
            m.door_hold.n,
            1000 * m.door_hold.total / max(1, m.door_hold.n),
            m.prefix_hits,
            m.prefix_queries,
            m.preemptions,
            m.lane_prefills,
        )


def below(n: int) -> str:
    """A regex for the decimal strings of 0..n-1 (leading zeros too: the server reads them with int())."""
    top = str(n - 1)
    alts = [f"[0-9]{{1,{len(top) - 1}}}"] if len(top) > 1 else []
    alts += [top[:i] + f"[0-{int(d) - 1}][0-9]{{{len(top) - i - 1}}}" for i, d in enumerate(top) if d != "0"]
    return "^0*(" + "|".join(alts + [top]) + ")$"


def _served_bounds(
    node,
    vocab: int | None,
    context: int | None,
    names: list[str],
    writable: str | None = None,
    hidden: int | None = None,
) -> None:
    """Say in the schema what the server enforces for the model it serves: token ids below its
    vocabulary size (`logit_bias`' keys too), max_tokens below its context, embeddings'
    `dimensions` its hidden size, and `model` one of the names it answers to (else a 400
    model_not_found)."""
    if isinstance(node, dict):
        if node.pop("x-tailgate-token-id", None) and vocab is not None:
            node["maximum"] = vocab - 1
        if node.pop("x-tailgate-token-key", None) and vocab is not None:
            node["pattern"] = below(vocab)
        if node.pop("x-tailgate-context", None) and context is not None:
            node["maximum"] = context - 1
        if node.pop("x-tailgate-writable", None) and writable is not None:
            node["pattern"] = writable
        if node.pop("x-tailgate-hidden", None) and hidden is not None:
            node["minimum"] = node["maximum"] = hidden
        props = node.get("properties")
        if (
            isinstance(props, dict)
            and "model" in props
            and "messages" in props
            or isinstance(props, dict)
            and "model" in props
            and "prompt" in props
            or isinstance(props, dict)
            and "model" in props
            and "input" in props
        ):
            props["model"] = {"anyOf": [{"type": "string", "enum": names}, {"type": "null"}], "title": "Model"}
        for v in node.values():
            _served_bounds(v, vocab, context, names, writable, hidden)
    elif isinstance(node, list):
        for v in node:
            _served_bounds(v, vocab, context, names, writable, hidden)


def _openapi(app: FastAPI):
    def build() -> dict:
        if app.openapi_schema is None:
            state = app.state.tailgate
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            comps = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in schema.REQUESTS + schema.STREAMED:
                s = model.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(s.pop("$defs", {}))
                comps[model.__name__] = s
            vocab = state.model.spec.vocab_size if state.ready else None
            context = state.cfg.max_context if state.ready else None
            writable = unwritable(state.model.tokenizer) if state.ready else None
            hidden = state.model.spec.hidden if state.ready else None
            _served_bounds(comps, vocab, context, [state.served_name, "default"], writable, hidden)
            if not state.ready:  # the bounds are the model's: asked while it loads, build it again later
                return doc
            app.openapi_schema = doc
        return app.openapi_schema

    return build


def create_app(state: ServerState):
    # Every route raises ApiError for what a client did wrong; one handler turns it into the body.
    app = FastAPI(
        title="tailgate",
        version=__version__,
        docs_url=None,  # /docs is web.py's: Swagger UI from this server's own files, not a CDN
        redoc_url=None,
        lifespan=_lifespan,
        exception_handlers={
            ApiError: lambda req, exc: _error(exc),
            HTTPException: _http_error,
            Exception: lambda req, exc: _error(ApiError(500, f"internal error: {exc!r}")),
        },
    )
    app.state.tailgate = state
    app.state.registry = registry_for(state)
    app.state.methods = {}  # path -> the methods its routes take (a 405's Allow)
    for module in (generation, tokenize, service, embeddings, responses):
        app.include_router(module.router)
        for r in module.router.routes:
            app.state.methods.setdefault(r.path, set()).update(r.methods)
    app.include_router(web.router)  # the playground and the dashboard (docs/web.md)
    app.openapi = _openapi(app)
    if state.allowed_origins:  # off by default: a browser page on another origin gets no answer it can read
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(state.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
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
