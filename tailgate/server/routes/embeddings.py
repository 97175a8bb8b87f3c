"""OpenAI's /v1/embeddings, from the served decoder LM: each input's last-token final hidden state,
L2-normalized (vLLM's default pooling for a decoder served as an embedding model;
`model/runtime/pooling.py`). The forward passes run on the engine thread, between its steps
(`Engine.call`): the engine thread owns the runner and the page book, and a pass on another thread
would race its steps for the KV pools and the cores."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from .. import schema
from ..errors import ApiError, bad
from ..guards import ERRORS, admitted_body, check_model, openapi_body, server_state
from ..protocol import validate
from ...model.runtime.pooling import NoRoom, embed

router = APIRouter()

# Prompt rows per forward pass: the inputs are packed into passes of at most this many rows (an
# input longer than this has a pass of its own), so the live streams wait for one pass of at most
# PASS_ROWS rows at a time, as for one prefill chunk, not for the whole request.
PASS_ROWS = 512


def _prompts(m: schema.EmbeddingRequest, tok, vocab: int, context: int) -> list[list[int]]:
    """The inputs as token-id lists (text through the served tokenizer), each checked against the
    vocabulary and the context."""
    x = m.input
    add_bos = (m.add_special_tokens is not False) and tok.add_bos
    if isinstance(x, str):
        prompts = [tok.encode(x, add_bos)]
    elif isinstance(x[0], str):
        prompts = [tok.encode(t, add_bos) for t in x]
    elif isinstance(x[0], int):
        prompts = [list(x)]
    else:
        prompts = [list(p) for p in x]
    for i, p in enumerate(prompts):
        if not p:
            raise bad(f"'input' [{i}] has no tokens", "input")
        if any(not 0 <= t < vocab for t in p):
            raise bad(f"'input' [{i}]: token ids must be in 0..{vocab - 1}", "input")
        if len(p) > context:
            raise bad(
                f"'input' [{i}] is {len(p)} tokens; this model's maximum context length is {context} tokens", "input"
            )
    return prompts


def _passes(prompts: list[list[int]], rows: int) -> list[list[int]]:
    """Indices of `prompts` grouped into passes of at most `rows` rows each (an input longer than
    that alone)."""
    out, cur, n = [], [], 0
    for i, p in enumerate(prompts):
        if cur and n + len(p) > rows:
            out.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += len(p)
    return out + [cur] if cur else out


def _encode(v: np.ndarray, fmt: str | None):
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


@router.post(
    "/v1/embeddings",
    openapi_extra=openapi_body(schema.EmbeddingRequest),
    responses={200: {"model": schema.EmbeddingResponse}, **ERRORS},
)
async def embeddings(req: Request):
    m = validate(schema.EmbeddingRequest, await admitted_body(req))
    state = server_state(req)
    check_model(state, m.model)
    spec = state.model.spec
    if m.dimensions is not None and m.dimensions != spec.hidden:
        raise bad(
            f"'dimensions' must be {spec.hidden}, this model's hidden size (embeddings are not truncated)",
            "dimensions",
        )
    context = state.cfg.max_context
    prompts = await run_in_threadpool(_prompts, m, state.model.tokenizer, spec.vocab_size, context)
    sched = state.engine.scheduler
    runner, book = sched.executor.runner, sched.book
    vectors: list = [None] * len(prompts)
    for group in _passes(prompts, min(PASS_ROWS, context)):
        batch = [prompts[i] for i in group]
        try:
            out = await asyncio.wrap_future(state.engine.call(lambda b=batch: embed(runner, book, b)))
        except NoRoom as e:
            raise ApiError(429, f"{e}; retry shortly", headers={"Retry-After": "1"}) from None
        for i, v in zip(group, out.numpy()):
            vectors[i] = _encode(v, m.encoding_format)
        if await req.is_disconnected():
            return Response(status_code=499)
    n = sum(map(len, prompts))
    return JSONResponse(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "model": state.served_name,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }
    )
