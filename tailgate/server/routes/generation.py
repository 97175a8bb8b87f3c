"""OpenAI's completions and chat completions: parse, admit, stream or collect."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from .. import schema
from ..generation import Generation
from ..guards import ERRORS, admitted_body, check_model, openapi_body, server_state
from ..logs import log_request
from ..protocol import parse_chat, parse_completion

router = APIRouter()


def sse(chunk) -> dict:
    """`stream: true` answers server-sent events, documented beside the JSON body (schemathesis'
    ST105). Before OpenAPI 3.2's `itemSchema`, a text/event-stream `schema` describes one event
    (schemathesis reads it so: ST108): its `data` is a chunk of this endpoint's kind as JSON text,
    an error body (a request whose row fails mid-stream), or the closing `[DONE]`."""
    ref = lambda m: {"$ref": f"#/components/schemas/{m.__name__}"}  # noqa: E731
    return {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "required": ["data"],
                "description": "one event: data: {chunk} ..., then data: [DONE]",
                "properties": {
                    "data": {
                        "type": "string",
                        "anyOf": [
                            {"const": "[DONE]"},
                            {
                                "contentMediaType": "application/json",
                                "contentSchema": {"anyOf": [ref(chunk), ref(schema.ErrorResponse)]},
                            },
                        ],
                    }
                },
            }
        }
    }


async def generate(req: Request, kind: str):
    body = await admitted_body(req)
    state = server_state(req)
    parse = parse_completion if kind == "completion" else parse_chat
    # Tokenizing a long prompt (or many) takes milliseconds: off the event loop, so the
    # streams it serves keep flowing.
    g = await run_in_threadpool(
        parse, body, state.model.tokenizer, state.model.spec.vocab_size, state.sampling_defaults
    )
    check_model(state, g.model)
    gen = Generation(state, g)
    gen.start()
    return await answer(req, gen, g.stream)


async def answer(req: Request, gen: Generation, stream: bool, events=None, whole=None):
    """A started generation's answer, logged once it ends: its SSE events (`events(gen)`, default
    the generation's own chunks) to the end or until the client goes (499), or, collected, its
    whole body (`whole(body)`, default as is). The chat and completion routes and /v1/responses
    answer through it."""
    started, path = time.monotonic(), req.url.path
    if stream:

        async def logged():
            try:
                async for event in events(gen) if events is not None else gen.sse():
                    yield event
            finally:  # streamed out, or cut by its client
                log_request(gen, "POST", path, 200 if not gen.live() else 499, started)

        return StreamingResponse(
            logged(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
    if not await gen.collect(req.is_disconnected):
        log_request(gen, "POST", path, 499, started)
        return Response(status_code=499)
    body = gen.full() if whole is None else whole(gen.full())
    log_request(gen, "POST", path, 200, started)
    return JSONResponse(body)


@router.post(
    "/v1/completions",
    openapi_extra=openapi_body(schema.CompletionRequest),
    responses={200: {"model": schema.CompletionResponse, "content": sse(schema.CompletionChunk)}, **ERRORS},
)
async def completions(req: Request):
    return await generate(req, "completion")


@router.post(
    "/v1/chat/completions",
    openapi_extra=openapi_body(schema.ChatCompletionRequest),
    responses={200: {"model": schema.ChatCompletionResponse, "content": sse(schema.ChatCompletionChunk)}, **ERRORS},
)
async def chat(req: Request):
    return await generate(req, "chat")
