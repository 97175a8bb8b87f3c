"""Per-request generation lifecycle: one HTTP generation fans out into engine requests (n choices per
prompt), hears their events on one queue, and delivers them collected or streamed; what the
responses look like is its `Shape`'s (shapes.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

from ..engine.request import Finished, Rejected, Request, Scheduled, Token
from .protocol import ApiError, GenRequest, bad
from ..engine.prompt_logprobs import PromptLogprobs
from ..engine.stop import clamp_max_tokens
from .shapes import shape_for
from .state import ServerState
from .text import TextStream

log = logging.getLogger("tailgate.server")


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
    prompt_logprobs: list | None = None  # the engine's PromptLogprobs entries, when asked
    prompt_unsent: bool = False  # they arrived and no chunk has carried them yet
    offset: int = 0  # text_offset of the next token (completions' logprobs)
    first_at: float | None = None  # engine time of its first token (the access log's TTFT)
    written_at: float | None = None  # when its latest chunk was written to the socket (streams)


class Generation:
    """One HTTP generation: n choices per prompt, each an engine request, one event queue."""

    def __init__(self, state: ServerState, g: GenRequest):
        self.state, self.g = state, g
        self.id = ("cmpl-" if g.kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[Choice] = []
        self.prompt_tokens = sum(len(p) for p in g.prompts)
        self.cached_tokens = 0  # of those, served from the prefix cache (summed over choices, as prompt_tokens)
        self.shape = shape_for(g, state.model.tokenizer, getattr(getattr(state.model, "spec", None), "arch", None))
        # The delivery fence's share of this stream (engine/loop.py DeliveryFence): tokens the
        # engine handed over (`fenced`, engine thread) and tokens written or dropped (`written`,
        # event loop); `closed` once the stream ends, so a late step adds nothing it would wait on.
        self._fence_lock = threading.Lock()
        self.fenced = self.written = 0
        self.closed = False

    def start(self) -> None:
        st, g = self.state, self.g
        loop = asyncio.get_running_loop()
        tok = st.model.tokenizer
        ceiling = st.cfg.max_context
        for name, v in g.max_tokens_asked.items():  # /openapi.json's maximum: no prompt would leave room
            if v >= ceiling:
                raise bad(
                    f"'{name}' is {v}, but this model's maximum context length is {ceiling} tokens "
                    f"(a prompt takes at least one): at most {ceiling - 1}",
                    name,
                )
        for p in g.prompts:
            if len(p) >= ceiling:
                raise bad(
                    f"This model's maximum context length is {ceiling} tokens, but the prompt contains "
                    f"{len(p)} tokens (at least one token must be left for the completion)",
                    "prompt",
                )
        waiting_tokens = sum(st.pending.values())
        new, new_tokens = len(g.prompts) * g.n, self.prompt_tokens * g.n
        if new > st.max_queued_requests or new_tokens > st.max_queued_tokens:
            # Even an empty queue could not take it: a 429 would ask the client to retry forever.
            raise bad(
                f"this request needs {new} queue entries and {new_tokens} prompt tokens; the "
                f"server queues at most {st.max_queued_requests} and {st.max_queued_tokens}",
                "n",
            )
        if len(st.pending) + new > st.max_queued_requests or waiting_tokens + new_tokens > st.max_queued_tokens:
            raise ApiError(
                429,
                f"the waiting queue is full ({len(st.pending)} requests, {waiting_tokens} tokens "
                "waiting); retry shortly",
                headers={"Retry-After": "1"},
            )
        for pi, p in enumerate(g.prompts):
            for j in range(g.n):
                params = g.params
                if params.seed is not None and j:
                    params = replace(params, seed=params.seed + j)
                # max_tokens unset: the engine resolves it (engine/stop.py), as for every caller.
                # Set, it is a ceiling beside the context's: the answer ends at whichever comes first
                # (finish "length"). A schema cannot say how many tokens a prompt is, so a value the
                # schema takes is served rather than refused for this prompt (schemathesis' ST202).
                cap = clamp_max_tokens(g.max_tokens, len(p), ceiling)
                r = Request(
                    prompt=p,
                    max_tokens=cap,
                    params=params,
                    eos_ids=frozenset(tok.eos_ids),
                    stop_token_ids=frozenset(g.stop_token_ids),
                    ignore_eos=g.ignore_eos,
                    min_tokens=g.min_tokens,
                    logprobs=g.logprobs,
                    prompt_logprobs=g.score_prompt,
                )
                if g.max_tokens == 0:  # the prompt's echo and logprobs only: one token runs and is dropped
                    r.max_tokens, r.min_tokens = 1, 0
                idx = len(self.choices)
                r.sink = lambda ev, idx=idx: self._sink(loop, idx, ev)
                self.choices.append(
                    Choice(idx, r, TextStream(tok, g.stop, g.skip_special_tokens, g.include_stop_str_in_output))
                )
        for c in self.choices:
            st.pending[c.req.id] = len(c.req.prompt)
            st.engine.submit(c.req)

    def _sink(self, loop, idx: int, ev) -> None:
        """The engine thread hands over one event. A streamed token is fenced: the engine does not
        launch its next step (up to DELIVERY_WAIT_MS) until the stream has written it."""
        if self.g.stream and isinstance(ev, Token):
            with self._fence_lock:
                if not self.closed:
                    self.fenced += 1
                    self.state.engine.fence.add(1)
        loop.call_soon_threadsafe(self.queue.put_nowait, (idx, ev))

    def _release(self, n: int, close: bool = False) -> None:
        """`n` fenced tokens are written (or will never be): the engine stops waiting on them."""
        with self._fence_lock:
            if close:
                self.closed = True
                n = self.fenced - self.written
            n = min(n, self.fenced - self.written)
            self.written += n
        self.state.engine.fence.done(n)

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
            self.cached_tokens += ev.cached_tokens
            return None
        if isinstance(ev, PromptLogprobs):
            c.prompt_logprobs, c.prompt_unsent = ev.entries, True
            return self.shape.prompt_text(c) if self.g.echo and self.g.stream else ""
        if isinstance(ev, Token) and self.g.max_tokens == 0:
            self._finish(c, "length", ev.at)
            return ""
        if isinstance(ev, Token):
            (st.ttft if c.last_at is None else st.itl).observe(ev.at - (c.last_at or c.req.arrival))
            c.first_at = c.first_at or ev.at
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
            elif ev.finish == "length":
                # The last token (the engine says so on it): finish on its own chunk, as vLLM does,
                # instead of sending an empty chunk when the engine's Finished arrives a moment later.
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
        log.info(
            "request %s finished %s prompt=%d completion=%d e2e=%.3fs",
            c.req.id,
            reason,
            len(c.req.prompt),
            c.tokens,
            at - c.req.arrival,
        )

    def usage(self) -> dict:
        comp = sum(c.tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": comp,
            "total_tokens": self.prompt_tokens + comp,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    # ---- response shapes (the Shape's) ------------------------------------------------------
    def chunk(self, c: Choice, text: str, items: list, finish: str | None, first: bool = False) -> dict:
        return {
            "id": self.id,
            "object": self.shape.object_chunk,
            "created": self.created,
            "model": self.state.served_name,
            "choices": [self.shape.chunk_choice(c, text, items, finish, first)],
            **self.shape.chunk_extra(c),
        }

    def full(self) -> dict:
        return {
            "id": self.id,
            "object": self.shape.object_full,
            "created": self.created,
            "model": self.state.served_name,
            "choices": [self.shape.full_choice(c) for c in self.choices],
            "usage": self.usage(),
            **self.shape.full_extra(self.choices),
        }

    # ---- delivery ---------------------------------------------------------------------------
    async def collect(self, is_disconnected) -> bool:
        """Wait for every choice to finish (non-streaming); False if the client left first (its
        requests are aborted). `is_disconnected` is the HTTP request's coroutine function."""
        try:
            while self.live():
                try:
                    idx, ev = await asyncio.wait_for(self.queue.get(), 0.5)
                except asyncio.TimeoutError:
                    if await is_disconnected():
                        self.abort_all()
                        return False
                    continue
                self.handle(idx, ev)
                # Once per step (when this step's events are drained), not only after 0.5 s of
                # silence: a busy request hears events every step. Starlette 1.10 also cancels
                # this handler when the connection drops; this check does not rely on that.
                if self.queue.empty() and await is_disconnected():
                    self.abort_all()
                    return False
        except BaseException:  # an ApiError from an event, or the handler cancelled
            self.abort_all()
            raise
        return True

    async def sse(self):
        """The server-sent events of a streaming response, ending with `data: [DONE]`. One engine
        step's chunks leave as one write; once written, their tokens are released from the
        delivery fence and timed (`tailgate:delivery_delay_seconds`: sampled -> written)."""
        sse = lambda obj: f"data: {json.dumps(obj)}\n\n"  # noqa: E731
        st, clock = self.state, self.state.engine.clock
        # After a keep-alive comment the next write starts with an empty comment event (":\n\n").
        # vLLM's bench client strips every network read and splits its buffer on blank lines, so a
        # lone ": keep-alive" stays in its buffer, glued to the next event, which it then skips as
        # a comment; the empty comment ends that glued text as an event of its own. Any SSE reader
        # (EventSource, the openai SDK) skips both comments.
        resume = ""
        try:
            opening = ""
            for c in self.choices:
                if (o := self.shape.opening(c)) is not None:
                    opening += sse(self.chunk(c, o[0], [], None, first=o[1]))
            if opening:
                yield opening
            while self.live():
                try:  # silent for sse_keep_alive seconds (queued, or a long step): an SSE comment,
                    # which clients skip and idle-timeout proxies count as traffic
                    batch = [await asyncio.wait_for(self.queue.get(), st.keep_alive_s)]
                except asyncio.TimeoutError:
                    yield ": keep-alive\n\n"
                    resume = ":\n\n"
                    continue
                while not self.queue.empty():  # events of one engine step arrive together
                    batch.append(self.queue.get_nowait())
                out, failed = [], None
                for idx, ev in batch:
                    c = self.choices[idx]
                    if c.finish is not None:
                        continue
                    seen = len(c.logprobs)
                    try:
                        text = self.handle(idx, ev)
                    except ApiError as e:
                        failed = e
                        break
                    items = c.logprobs[seen:]
                    if text or items or (isinstance(ev, Token) and text is not None):
                        out.append(self.chunk(c, text or "", items, None))
                        # Extension field (clients ignore unknown keys): the step that produced
                        # this chunk's latest token, so a client can see why a gap was long.
                        out[-1]["tailgate"] = c.cause
                    if c.finish is not None:
                        # The finish reason rides the choice's last chunk when it has one in this
                        # batch (as vLLM's does), so clients do not see an extra empty "token".
                        last = next((o for o in reversed(out) if o["choices"][0]["index"] == idx), None)
                        if last is not None:
                            self.shape.close(last["choices"][0], c)
                        else:
                            out.append(self.chunk(c, "", [], c.finish))
                text = "".join(sse(o) for o in out) + (sse(failed.body()) if failed is not None else "")
                if text:
                    yield resume + text
                    resume = ""
                tokens = [ev for _, ev in batch if isinstance(ev, Token)]
                if tokens:
                    now = clock()
                    delays = [now - ev.at for ev in tokens]
                    st.delivery.observe_all(delays)
                    st.delivery_window.extend((now, d) for d in delays)
                    for idx in {o["choices"][0]["index"] for o in out}:
                        c = self.choices[idx]
                        if c.written_at is not None:
                            st.socket_itl.observe(now - c.written_at)
                            st.socket_window.append((now, now - c.written_at))
                        c.written_at = now
                    self._release(len(tokens))
                if failed is not None:
                    break
            if self.g.include_usage:
                yield resume + sse(
                    {
                        "id": self.id,
                        "object": self.shape.object_chunk,
                        "created": self.created,
                        "model": self.state.served_name,
                        "choices": [],
                        "usage": self.usage(),
                    }
                )
                resume = ""
            yield resume + "data: [DONE]\n\n"
        finally:
            self._release(0, close=True)  # the engine waits on nothing this stream will not write
            self.abort_all()  # a client that went away frees its pages at once
