"""The stop rule and the `max_tokens` default, decided once for every path that generates: the
scheduler, the serial reference (`model/runtime/serial.py`) and, through the scheduler, HTTP and the
simulator. Text-level stop *strings* are not here: they need detokenized text, which only the
server has (it cancels the request as `stop` when one matches)."""

from __future__ import annotations

from .request import Request

EMIT = None  # `verdict`: the token is emitted and the request goes on
STOP = "stop"  # an end-of-sequence or stop token: it ends the request and is not emitted
LENGTH = "length"  # the token is emitted and is the last (max_tokens reached)


def resolve_max_tokens(req: Request, max_context: int, default: int | None) -> None:
    """Fill an unset `max_tokens` as vLLM does: the configured default (DEFAULT_MAX_TOKENS; None
    means the whole context), never past the context left after the prompt; `min_tokens` is
    clamped to it. An explicit `max_tokens` is kept as asked (the scheduler refuses one that
    does not fit, naming both numbers)."""
    if req.max_tokens is None:
        room = max_context - len(req.prompt)
        req.max_tokens = min(default or room, room)
    req.min_tokens = min(req.min_tokens, max(req.max_tokens, 0))


def clamp_max_tokens(asked: int | None, prompt_len: int, max_context: int) -> int | None:
    """An explicit max_tokens as a ceiling beside the context's: the answer ends at whichever comes
    first (finish "length"); unset (None) stays unset for `resolve_max_tokens`. The one clamp the
    server and the simulator apply (issue 36: it was written three times)."""
    return None if asked is None else min(asked, max_context - prompt_len)


def verdict(req: Request, token: int, emitted: int) -> str | None:
    """What `token`, sampled after `emitted` output tokens, does to `req`: EMIT, STOP or LENGTH."""
    if token in req.stop_token_ids or (token in req.eos_ids and not req.ignore_eos):
        return STOP
    return LENGTH if emitted + 1 >= req.max_tokens else EMIT
