"""The HTTP routes (FastAPI): OpenAI's completions and chat, tokenize, models, health, version,
metrics, and `/openapi.json`; body limits, auth, and errors as OpenAI error bodies.

The generation routes read their body themselves instead of letting FastAPI parse it: the body
is bounded while it streams in (413), Python's JSON parser must be told that NaN and Infinity are
not JSON, and every failure has to be an OpenAI error body rather than FastAPI's 422 shape. Their
request schemas are still published (`openapi_extra`), from the same pydantic models that
validate them (`schema.py`).
"""
from __future__ import annotations

import contextlib

import hmac
import json
import logging

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from . import schema
from .generation import Generation, ServerState
from .metrics import CONTENT_TYPE, registry_for, render
from .protocol import ApiError, bad, chat_prompt, parse_chat, parse_completion, template_options, validate

__all__ = ["ServerState", "create_app"]
log = logging.getLogger("tailgate.server")


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _no_constant(name: str):
    """Python's JSON parser accepts NaN and Infinity; JSON and the OpenAI API do not."""
    raise bad(f"malformed JSON body: {name} is not a JSON number")


def _body(model) -> dict:
    """OpenAPI for a route that parses its own body as `model`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


_ERRORS = {code: {"model": schema.ErrorResponse} for code in (400, 401, 413, 415, 429, 503)}


def create_app(state: ServerState) -> FastAPI:
    async def parse_body(req: Request) -> dict:
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":  # a browser's cross-site text/plain POST must not run work
            raise ApiError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
        declared = req.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > state.max_body_bytes:
            raise ApiError(413, f"request body of {declared} bytes exceeds the server's {state.max_body_bytes} "
                                "(tailgate serve --max-body-mb)")
        raw = bytearray()
        async for part in req.stream():  # a chunked body without Content-Length is bounded too
            raw += part
            if len(raw) > state.max_body_bytes:
                raise ApiError(413, f"request body exceeds the server's {state.max_body_bytes} bytes "
                                    "(tailgate serve --max-body-mb)")
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

    def check_auth(req: Request) -> None:
        if state.api_key is None:
            return
        got = req.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {state.api_key}".encode()):
            raise ApiError(401, "invalid or missing API key", code="invalid_api_key")

    def check_ready() -> None:
        if not state.ready:
            raise ApiError(503, state.load_error or "the model is still loading")
        if state.engine.error is not None:
            raise ApiError(503, f"engine failed: {state.engine.error!r}; the server is exiting")

    def check_model(name: str | None) -> None:
        if name is not None and name not in (state.served_name, "default"):
            raise ApiError(400, f"The model `{name}` does not exist.", "model", code="model_not_found")

    async def admitted_body(req: Request) -> dict:
        """What every POST route checks first, in this order: the key, the body (a bad body is a
        400 even while loading), then that the model is serving."""
        check_auth(req)
        body = await parse_body(req)
        check_ready()
        return body

    async def generate(req: Request, kind: str):
        body = await admitted_body(req)
        parse = parse_completion if kind == "completion" else parse_chat
        # Tokenizing a long prompt (or many) takes milliseconds: off the event loop, so the
        # streams it serves keep flowing.
        g = await run_in_threadpool(parse, body, state.model.tokenizer, state.model.spec.vocab_size)
        check_model(g.model)
        gen = Generation(state, g)
        gen.start()
        if g.stream:
            return StreamingResponse(gen.sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        if not await gen.collect(req.is_disconnected):
            return Response(status_code=499)
        return JSONResponse(gen.full())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # Uvicorn re-raises SIGTERM once it has shut down, so nothing after server.run() runs:
        # say here what the engine did, for runs whose /metrics nobody scraped (bench ab's logs).
        if state.engine is not None:
            m = state.engine.snapshot.metrics
            logging.getLogger("tailgate").info(
                "stopping after %d steps: door releases %s, %d held (mean %.1f ms), prefix cache hits %d of %d "
                "prompt tokens, %d preemptions, %d lane prefills", m.steps, dict(m.door_releases), m.door_hold.n,
                1000 * m.door_hold.total / max(1, m.door_hold.n), m.prefix_hits, m.prefix_queries, m.preemptions,
                m.lane_prefills)

    # Every route raises ApiError for what a client did wrong; one handler turns it into the body.
    app = FastAPI(title="tailgate", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan,
                  exception_handlers={ApiError: lambda req, exc: _error(exc), HTTPException: lambda req, exc: _error(
                      ApiError(exc.status_code, f"{req.method} {req.url.path}: {exc.detail}")),
                      Exception: lambda req, exc: _error(ApiError(500, f"internal error: {exc!r}"))})

    @app.post("/v1/completions", openapi_extra=_body(schema.CompletionRequest),
              responses={200: {"model": schema.CompletionResponse}, **_ERRORS})
    async def completions(req: Request):
        return await generate(req, "completion")

    @app.post("/v1/chat/completions", openapi_extra=_body(schema.ChatCompletionRequest),
              responses={200: {"model": schema.ChatCompletionResponse}, **_ERRORS})
    async def chat(req: Request):
        return await generate(req, "chat")

    @app.api_route("/v1/models", methods=["GET", "HEAD"],
                   responses={200: {"model": schema.ModelList}, 401: {"model": schema.ErrorResponse}})
    async def models(req: Request):
        check_auth(req)
        card = {"id": state.served_name, "object": "model", "created": 0, "owned_by": "tailgate",
                "max_model_len": state.cfg.max_context if state.cfg and state.cfg.max_context else None}
        return JSONResponse({"object": "list", "data": [card]})

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        if not state.ready:
            return JSONResponse({"status": "loading" if not state.load_error else state.load_error}, status_code=503)
        if state.engine.error is not None:
            return JSONResponse({"status": f"engine failed: {state.engine.error}"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.api_route("/version", methods=["GET", "HEAD"])
    async def version():
        return JSONResponse({"version": __version__, "kernels": state.kernels})

    @app.post("/tokenize", openapi_extra=_body(schema.TokenizeRequest),
              responses={200: {"model": schema.TokenizeResponse}, **_ERRORS})
    async def tokenize(req: Request):
        m = validate(schema.TokenizeRequest, await admitted_body(req))
        tok = state.model.tokenizer
        if m.messages is not None:
            ids = (await run_in_threadpool(chat_prompt, m.messages, tok, template_options(m)))[1]
        elif m.prompt is not None:
            add_bos = (m.add_special_tokens is not False) and tok.add_bos
            ids = await run_in_threadpool(tok.encode, m.prompt, add_bos)
        else:
            raise bad("'prompt' (a string) or 'messages' is required", "prompt")
        return JSONResponse({"count": len(ids), "max_model_len": state.cfg.max_context, "tokens": ids})

    @app.post("/detokenize", openapi_extra=_body(schema.DetokenizeRequest),
              responses={200: {"model": schema.DetokenizeResponse}, **_ERRORS})
    async def detokenize(req: Request):
        ids = validate(schema.DetokenizeRequest, await admitted_body(req)).tokens
        v = state.model.spec.vocab_size
        if not all(0 <= t < v for t in ids):
            raise bad(f"'tokens' must be a list of token ids in 0..{v - 1}", "tokens")
        return JSONResponse({"prompt": state.model.tokenizer.decode(ids, skip_special=False)})

    registry = registry_for(state)

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics():
        return Response(render(registry), media_type=CONTENT_TYPE)

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            comps = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in schema.REQUESTS:
                s = model.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(s.pop("$defs", {}))
                comps[model.__name__] = s
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
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
