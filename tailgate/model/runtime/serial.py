"""The serial reference path: one sequence at a time, prefill then decode.

This is what the batched engine must match token for token; the CLI's `generate` uses it too.
"""

from __future__ import annotations

import torch

from ...engine.pages import KVBook, SeqPages
from ...engine.plan import Segment
from ...engine.request import Request
from ...engine.stop import LENGTH, STOP, verdict
from .runner import ModelRunner
from .sampler import SamplingParams, make_generator, sample


def generate(
    runner: ModelRunner,
    book: KVBook,
    prompt: list[int],
    max_tokens: int,
    params: SamplingParams | None = None,
    eos_ids=(),
    chunk: int | None = None,
    on_token=None,
) -> list[int]:
    params = params or SamplingParams()
    req = Request(prompt, max_tokens, params, eos_ids=frozenset(eos_ids))  # for the engine's stop rule
    gen = make_generator(params.seed)
    seq = SeqPages()
    out: list[int] = []
    try:
        if not book.reserve(seq, len(prompt)):
            raise RuntimeError("prompt does not fit the KV pools")
        step = chunk or len(prompt)
        for s in range(0, len(prompt), step):
            piece = prompt[s : s + step]
            logits = runner.step([Segment(piece, s, seq)])
            book.advance(seq, len(piece))
        while True:
            tok = sample(logits, [params], [gen])[0]
            end = verdict(req, tok, len(out))
            if end is STOP:
                break
            out.append(tok)
            if on_token:
                on_token(tok)
            if end is LENGTH:
                break
            if not book.reserve(seq, seq.frontier + 1):
                raise RuntimeError("out of KV pages")
            logits = runner.step([Segment([tok], seq.frontier, seq)])
            book.advance(seq, 1)
    finally:
        book.free(seq)
    return out


def teacher_forced_logits(runner: ModelRunner, book: KVBook, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Logits at every position of `ids` [len(ids), vocab], prefilled in `chunk`-sized pieces."""
    seq = SeqPages()
    try:
        if not book.reserve(seq, len(ids)):
            raise RuntimeError("sequence does not fit the KV pools")
        out = []
        step = chunk or len(ids)
        for s in range(0, len(ids), step):
            piece = ids[s : s + step]
            out.append(runner.step([Segment(piece, s, seq, all_logits=True)]))
            book.advance(seq, len(piece))
        return torch.cat(out)
    finally:
        book.free(seq)
