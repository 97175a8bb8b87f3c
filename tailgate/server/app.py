"""The HTTP application: OpenAI routes over the engine thread, SSE streaming, errors, limits."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..engine.metrics import Histogram
from ..engine.request import Finished, Rejected, Request, Scheduled, Token
from .metrics import CONTENT_TYPE, registry_for, render
from .protocol import ApiError, GenRequest, bad, parse_chat, parse_completion
from .text import TextStream

log = logging.getLogger("tailgate.server")


@dataclass
class ServerState:
    served_name: str
    api_key: str | None = None
    max_queued_requests: int = 256
    max_queued_tokens: int = 1 << 20
    max_body_bytes: int = 8 << 20  # 413 beyond this: a 4096-token prompt is ~20-40 KB of JSON
    engine: object = None  # set once the model is loaded
    model: object = None
    cfg: object = None
    load_error: str | None = None
    kernels: dict | None = None  # the KernelPlan chosen at start (`/version` shows it)
    allowed_hosts: frozenset | None = None  # Host header names served (None: any; see main.allowed_hosts)
    pending: dict = field(default_factory=dict)  # request id -> prompt tokens, until Scheduled
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)

    @property
    def ready(self) -> bool:
        return self.engine is not None


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@dataclass
class Choice:
    index: int
    req: Request
    stream: TextStream
    tokens: int = 0
    finish: str | None = None
    logprobs: list = field(default_factory=list)  # (token, logprob, top)
    last_at: float | None = None
    cause: dict | None = None  # stall attribution of the latest token (streamed as "tailgate")


class Generation:
    """One HTTP generation: n choices per prompt, each an engine request, one event queue."""

    def __init__(self, state: ServerState, g: GenRequest):
        self.state, self.g = state, g
        self.id = ("cmpl-" if g.kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[Choice] = []
        self.prompt_tokens = sum(len(p) for p in g.prompts)

    def start(self) -> None:
        st, g = self.state, self.g
        loop = asyncio.get_running_loop()
        tok = st.model.tokenizer
        ceiling = st.cfg.max_context
        for p in g.prompts:
            if len(p) >= ceiling:
                raise bad(f"This model's maximum context length is {ceiling} tokens, but the prompt contains "
                          f"{len(p)} tokens (at least one token must be left for the completion)", "prompt")
        waiting_tokens = sum(st.pending.values())
        new, new_tokens = len(g.prompts) * g.n, self.prompt_tokens * g.n
        if new > st.max_queued_requests or new_tokens > st.max_queued_tokens:
            # Even an empty queue could not take it: a 429 would ask the client to retry forever.
            raise bad(f"this request needs {new} queue entries and {new_tokens} prompt tokens; the "
                      f"server queues at most {st.max_queued_requests} and {st.max_queued_tokens}", "n")
        if len(st.pending) + new > st.max_queued_requests or waiting_tokens + new_tokens > st.max_queued_tokens:
            raise ApiError(429, f"the waiting queue is full ({len(st.pending)} requests, {waiting_tokens} tokens "
                                "waiting); retry shortly", headers={"Retry-After": "1"})
        for pi, p in enumerate(g.prompts):
            max_tokens = min(g.max_tokens or st.cfg.default_max_tokens or ceiling, ceiling - len(p))
            for j in range(g.n):
                params = g.params
                if params.seed is not None and j:
                    params = replace(params, seed=params.seed + j)
                r = Request(prompt=p, max_tokens=max_tokens, params=params, eos_ids=frozenset(tok.eos_ids),
                            stop_token_ids=frozenset(g.stop_token_ids), ignore_eos=g.ignore_eos,
                            min_tokens=min(g.min_tokens, max_tokens), logprobs=g.logprobs)
                idx = len(self.choices)
                r.sink = lambda ev, idx=idx: loop.call_soon_threadsafe(self.queue.put_nowait, (idx, ev))
                self.choices.append(Choice(idx, r, TextStream(tok, g.stop, g.skip_special_tokens,
                                                              g.include_stop_str_in_output)))
        for c in self.choices:
            st.pending[c.req.id] = len(c.req.prompt)
            st.engine.submit(c.req)

    def live(self) -> bool:
        return any(c.finish is None for c in self.choices)

    def abort_all(self) -> None:
        for c in self.choices:
            self.state.pending.pop(c.req.id, None)
            if c.finish is None:
                self.state.engine.abort(c.req)

    def handle(self, idx: int, ev) -> str | None:
        """Apply one engine event; returns new text for the choice (or None)."""
        st, c = self.state, self.choices[idx]
        if c.finish is not None:
            return None
        if isinstance(ev, Scheduled):
            st.pending.pop(c.req.id, None)
            st.queue_time.observe(ev.at - ev.queued_at)
            return None
        if isinstance(ev, Token):
            (st.ttft if c.last_at is None else st.itl).observe(ev.at - (c.last_at or c.req.arrival))
            c.last_at = ev.at
            c.tokens += 1
            c.cause = {"cause": ev.cause, "prompt_rows": ev.prompt_rows, "prompts": ev.prompts}
            if c.req.logprobs is not None:
                c.logprobs.append((ev.token, ev.logprob, ev.top_logprobs or []))
            text = c.stream.push(ev.token)
            if c.stream.stopped:
                self._finish(c, "stop", ev.at)
                c.req.cancel_as = "stop"  # a success in /metrics, not an abort
                st.engine.abort(c.req)
            elif c.tokens >= c.req.max_tokens:
                # The last token: finish on its own chunk, as vLLM does, instead of sending an
                # empty chunk when the engine's Finished arrives a moment later.
                text += c.stream.flush()
                self._finish(c, "length", ev.at)
            return text
        if isinstance(ev, Rejected):
            st.pending.pop(c.req.id, None)
            raise bad(ev.reason)
        if isinstance(ev, Finished):
            st.pending.pop(c.req.id, None)
            if ev.reason == "error":
                raise ApiError(500, f"generation failed: {ev.message}")
            self._finish(c, "length" if ev.reason == "length" else "stop", ev.at)
            return c.stream.flush()
        return None

    def _finish(self, c: Choice, reason: str, at: float) -> None:
        c.finish = reason
        self.state.e2e.observe(at - c.req.arrival)
        log.info("request %s finished %s prompt=%d completion=%d e2e=%.3fs", c.req.id, reason, len(c.req.prompt),
                 c.tokens, at - c.req.arrival)

    def usage(self) -> dict:
        comp = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": comp,
                "total_tokens": self.prompt_tokens + comp, "prompt_tokens_details": {"cached_tokens": 0}}

    # ---- response shapes ------------------------------------------------------------------
    def logprobs_block(self, c: Choice, items: list) -> dict | None:
        if c.req.logprobs is None:
            return None
        tok = self.state.model.tokenizer
        piece = lambda t: tok.decode([t], skip_special=False)  # noqa: E731
        if self.g.kind == "chat":
            return {"content": [{"token": piece(t), "logprob": lp, "bytes": list(piece(t).encode()),
                                 "top_logprobs": [{"token": piece(a), "logprob": b, "bytes": list(piece(a).encode())}
                                                  for a, b in top]} for t, lp, top in items]}
        return {"tokens": [piece(t) for t, _, _ in items], "token_logprobs": [lp for _, lp, _ in items],
                "top_logprobs": [{piece(a): b for a, b in top} for _, _, top in items],
                "text_offset": []}

    def chunk(self, c: Choice, text: str, items: list, finish: str | None, first: bool = False) -> dict:
        if self.g.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            ch = {"index": c.index, "delta": delta, "logprobs": self.logprobs_block(c, items), "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            ch = {"index": c.index, "text": text, "logprobs": self.logprobs_block(c, items), "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.state.served_name,
                "choices": [ch]}

    def full(self) -> dict:
        choices = []
        for c in self.choices:
            text = c.stream.final_text
            if self.g.kind == "chat":
                choices.append({"index": c.index, "message": {"role": "assistant", "content": text},
                                "logprobs": self.logprobs_block(c, c.logprobs), "finish_reason": c.finish})
            else:
                if self.g.echo:
                    text = self.g.prompt_texts[c.index // self.g.n] + text
                choices.append({"index": c.index, "text": text, "logprobs": self.logprobs_block(c, c.logprobs),
                                "finish_reason": c.finish})
        return {"id": self.id, "object": "chat.completion" if self.g.kind == "chat" else "text_completion",
                "created": self.created, "model": self.state.served_name, "choices": choices, "usage": self.usage()}


def _no_constant(name: str):
    """Python's JSON parser accepts NaN and Infinity; JSON and the OpenAI API do not."""
    raise bad(f"malformed JSON body: {name} is not a JSON number")


def create_app(state: ServerState) -> Starlette:
    async def parse_body(req: HttpRequest) -> dict:
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

    def check_auth(req: HttpRequest) -> None:
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

    async def generate(req: HttpRequest, kind: str):
        try:
            check_auth(req)
            body = await parse_body(req)  # a bad body is a 400 even while loading
            check_ready()
            parse = parse_completion if kind == "completion" else parse_chat
            # Tokenizing a long prompt (or many) takes milliseconds: off the event loop, so the
            # streams it serves keep flowing.
            g = await run_in_threadpool(parse, body, state.model.tokenizer, state.model.spec.vocab_size)
            check_model(g.model)
            gen = Generation(state, g)
            gen.start()
        except ApiError as e:
            return _error(e)
        if g.stream:
            return StreamingResponse(stream(gen), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while gen.live():
                try:
                    idx, ev = await asyncio.wait_for(gen.queue.get(), 0.5)
                except asyncio.TimeoutError:
                    if await req.is_disconnected():
                        gen.abort_all()
                        return Response(status_code=499)
                    continue
                gen.handle(idx, ev)
                # Once per step (when this step's events are drained), not only after 0.5 s of
                # silence: a busy request hears events every step. Starlette 1.10 also cancels
                # this handler when the connection drops; this check does not rely on that.
                if gen.queue.empty() and await req.is_disconnected():
                    gen.abort_all()
                    return Response(status_code=499)
        except ApiError as e:
            gen.abort_all()
            return _error(e)
        except asyncio.CancelledError:
            gen.abort_all()
            raise
        return JSONResponse(gen.full())

    async def stream(gen: Generation):
        sse = lambda obj: f"data: {json.dumps(obj)}\n\n"  # noqa: E731
        try:
            if gen.g.kind == "chat":
                for c in gen.choices:
                    yield sse(gen.chunk(c, "", [], None, first=True))
            elif gen.g.echo:
                for c in gen.choices:
                    yield sse(gen.chunk(c, gen.g.prompt_texts[c.index // gen.g.n], [], None))
            while gen.live():
                batch = [await gen.queue.get()]
                while not gen.queue.empty():  # events of one engine step arrive together
                    batch.append(gen.queue.get_nowait())
                out, failed = [], None
                for idx, ev in batch:
                    c = gen.choices[idx]
                    if c.finish is not None:
                        continue
                    seen = len(c.logprobs)
                    try:
                        text = gen.handle(idx, ev)
                    except ApiError as e:
                        failed = e
                        break
                    items = c.logprobs[seen:]
                    if text or items:
                        out.append(gen.chunk(c, text or "", items, None))
                        # Extension field (clients ignore unknown keys): the step that produced
                        # this chunk's latest token, so a client can see why a gap was long.
                        out[-1]["tailgate"] = c.cause
                    if c.finish is not None:
                        # The finish reason rides the choice's last chunk when it has one in this
                        # batch (as vLLM's does), so clients do not see an extra empty "token".
                        last = next((o for o in reversed(out) if o["choices"][0]["index"] == idx), None)
                        if last is not None:
                            last["choices"][0]["finish_reason"] = c.finish
                        else:
                            out.append(gen.chunk(c, "", [], c.finish))
                for o in out:
                    yield sse(o)
                if failed is not None:
                    yield sse(failed.body())
                    break
            if gen.g.include_usage:
                yield sse({"id": gen.id, "object": "chat.completion.chunk" if gen.g.kind == "chat" else
                           "text_completion", "created": gen.created, "model": state.served_name, "choices": [],
                           "usage": gen.usage()})
            yield "data: [DONE]\n\n"
        finally:
            gen.abort_all()  # a client that went away frees its pages at once

    async def completions(req):
        return await generate(req, "completion")

    async def chat(req):
        return await generate(req, "chat")

    async def models(req):
        try:
            check_auth(req)
        except ApiError as e:
            return _error(e)
        card = {"id": state.served_name, "object": "model", "created": 0, "owned_by": "tailgate",
                "max_model_len": state.cfg.max_context if state.cfg and state.cfg.max_context else None}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(req):
        if not state.ready:
            return JSONResponse({"status": "loading" if not state.load_error else state.load_error}, status_code=503)
        if state.engine.error is not None:
            return JSONResponse({"status": f"engine failed: {state.engine.error}"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def version(req):
        return JSONResponse({"version": __version__, "kernels": state.kernels})

    async def tokenize(req):
        try:
            check_auth(req)
            body = await parse_body(req)  # a bad body is a 400 even while loading
            check_ready()
            tok = state.model.tokenizer
            if "messages" in body:
                g = await run_in_threadpool(parse_chat, {"messages": body["messages"]}, tok, state.model.spec.vocab_size)
                ids = g.prompts[0]
            elif isinstance(body.get("prompt"), str):
                add_bos = bool(body.get("add_special_tokens", True)) and tok.add_bos
                ids = await run_in_threadpool(tok.encode, body["prompt"], add_bos)
            else:
                raise bad("'prompt' (a string) or 'messages' is required", "prompt")
        except ApiError as e:
            return _error(e)
        return JSONResponse({"count": len(ids), "max_model_len": state.cfg.max_context, "tokens": ids})

    async def detokenize(req):
        try:
            check_auth(req)
            body = await parse_body(req)  # a bad body is a 400 even while loading
            check_ready()
            ids = body.get("tokens")
            v = state.model.spec.vocab_size
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < v
                                                    for t in ids):
                raise bad(f"'tokens' must be a list of token ids in 0..{v - 1}", "tokens")
        except ApiError as e:
            return _error(e)
        return JSONResponse({"prompt": state.model.tokenizer.decode(ids, skip_special=False)})

    registry = registry_for(state)

    async def metrics(req):
        return Response(render(registry), media_type=CONTENT_TYPE)

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/models", models), Route("/health", health), Route("/version", version),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
              Route("/metrics", metrics)]

    async def not_found(req, exc):
        return _error(ApiError(exc.status_code, f"{req.method} {req.url.path}: {exc.detail}"))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
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
