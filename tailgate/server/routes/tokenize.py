"""vLLM's /tokenize and /detokenize: the served tokenizer (and chat template) over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from .. import schema
from ..guards import ERRORS, admitted_body, openapi_body, server_state
from ..protocol import bad, chat_prompt, template_options, validate

router = APIRouter()


@router.post(
    "/tokenize",
    openapi_extra=openapi_body(schema.TokenizeRequest),
    responses={200: {"model": schema.TokenizeResponse}, **ERRORS},
)
async def tokenize(req: Request):
    m = validate(schema.TokenizeRequest, await admitted_body(req))
    state = server_state(req)
    tok = state.model.tokenizer
    # The template's fields are checked whichever form came: the schema constrains them either way
    # (a fuzzed `prompt` body whose chat_template_kwargs.continue_final_message was a number got a 200).
    options = template_options(m, rendered=m.messages is not None)
    if m.messages is not None:
        ids = (await run_in_threadpool(chat_prompt, m.messages, tok, options))[1]
    elif m.prompt is not None:
        add_bos = (m.add_special_tokens is not False) and tok.add_bos
        ids = await run_in_threadpool(tok.encode, m.prompt, add_bos)
    else:
        raise bad("'prompt' (a string) or 'messages' is required", "prompt")
    return JSONResponse({"count": len(ids), "max_model_len": state.cfg.max_context, "tokens": ids})


@router.post(
    "/detokenize",
    openapi_extra=openapi_body(schema.DetokenizeRequest),
    responses={200: {"model": schema.DetokenizeResponse}, **ERRORS},
)
async def detokenize(req: Request):
    ids = validate(schema.DetokenizeRequest, await admitted_body(req)).tokens
    state = server_state(req)
    v = state.model.spec.vocab_size
    if not all(0 <= t < v for t in ids):
        raise bad(f"'tokens' must be a list of token ids in 0..{v - 1}", "tokens")
    return JSONResponse({"prompt": state.model.tokenizer.decode(ids, skip_special=False)})
