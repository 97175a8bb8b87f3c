"""Embeddings from a decoder LM, as vLLM pools one served as an embedding model (its `embed` task's
default for a decoder: LAST pooling, L2-normalized): the final hidden state (after the final norm)
of each input's last token, from one forward pass through scratch pages."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...engine.pages import SeqPages
from ...engine.plan import Segment


class NoRoom(RuntimeError):
    """The KV pools cannot hold the inputs' scratch pages now (the live requests hold them)."""


def embed(runner, book, prompts: list[list[int]]) -> torch.Tensor:
    """[len(prompts), hidden] fp32, each row the L2-normalized last-token hidden state of its
    prompt, all prompts in one forward pass. Their pages are reserved here and back before this
    returns; NoRoom (nothing reserved) when the pools cannot hold them all. Must run where the
    runner's steps run (the engine thread): the pass writes K/V into the shared pools."""
    seqs: list[SeqPages] = []
    try:
        for ids in prompts:
            seqs.append(SeqPages())
            if not book.reserve(seqs[-1], len(ids)):
                raise NoRoom(f"no KV pages for {sum(map(len, prompts))} tokens now")
        h = runner.hidden([Segment(list(ids), 0, s) for ids, s in zip(prompts, seqs)])
    finally:
        for s in seqs:
            book.free(s)
    return F.normalize(h.float(), dim=-1)
