"""OpenAI's /v1/responses, served through the chat path (server/responses.py)."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from .. import schema
from ..generation import Generation
from ..guards import ERRORS, admitted_body, check_model, openapi_body, server_state
from ..protocol import parse_chat, validate
from ..responses import ResponseEvents, chat_body, response_from
from .generation import answer

router = APIRouter()


def _events(text: str):
    """The `data:` objects of a piece of the chat stream (comments skipped, `[DONE]` dropped)."""
    for event in text.split("\n\n"):
        for line in event.split("\n"):
            if line.startswith("data: ") and line[6:] != "[DONE]":
                yield json.loads(line[6:])


@router.post(
    "/v1/responses",
    openapi_extra=openapi_body(schema.ResponsesRequest),
    responses={
        200: {
            "model": schema.ResponseObject,
            "content": {"text/event-stream": {"schema": {"type": "object", "description": "typed Responses events"}}},
        },
        **ERRORS,
    },
)
async def responses(req: Request):
    m = validate(schema.ResponsesRequest, await admitted_body(req))
    state = server_state(req)
    check_model(state, m.model)
    body = chat_body(m)
    g = await run_in_threadpool(
        parse_chat, body, state.model.tokenizer, state.model.spec.vocab_size, state.sampling_defaults
    )
    gen = Generation(state, g)
    gen.start()
    if not g.stream:
        return await answer(req, gen, False, whole=lambda body: response_from(body, m))
    events = ResponseEvents(m, state.served_name)

    async def typed(gen):
        yield events.start()
        async for piece in gen.sse():
            out = ""
            for obj in _events(piece):
                out += events.error(obj) if "error" in obj else events.chunk(obj)
            if out:
                yield out
        yield events.end()

    return await answer(req, gen, True, events=typed)
