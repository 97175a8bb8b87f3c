"""Prompt logprobs out of the engine (engine/prompt_logprobs.py, model/runtime/prompt_scores.py): each
prompt token's logprob given the tokens before it, as the model computes it on that prompt alone."""

from __future__ import annotations

import pytest
import torch

from tailgate.engine.prompt_logprobs import PromptLogprobs
from tailgate.engine.request import Finished, Token
from tailgate.model.runtime import serial
from harness import Harness, ids


@pytest.fixture(scope="module")
def reference(rig):
    """The model's own log-softmax over a 150-token prompt, one full-prompt teacher-forced pass."""
    r = rig("gemma3-270m", "fp32")
    prompt = ids(150, 7)
    lp = torch.log_softmax(serial.teacher_forced_logits(r.runner, r.book, prompt).float(), -1)
    return prompt, lp


@pytest.fixture(scope="module")
def engine(loaded):
    # The walk takes 64 rows a round and the prefix cache is on: a scored prompt crosses chunks and
    # may find its own pages cached, and must still compute (and score) every row.
    with Harness(loaded("gemma3-270m"), dtype="fp32", PREFIX_CACHE="4", MIX_CHUNK_TOKENS="64") as h:
        yield h


def _check(entries, prompt, lp, k):
    assert len(entries) == len(prompt) - 1
    for i, (logprob, rank, top) in enumerate(entries):
        row, target = lp[i], prompt[i + 1]
        assert logprob == pytest.approx(row[target].item(), abs=2e-3)
        # fp32 sums in another order (chunks, batch) move a logprob by ~1e-5: near-ties may swap
        assert int((row > row[target] + 2e-3).sum()) + 1 <= rank <= int((row >= row[target] - 2e-3).sum())
        assert torch.allclose(torch.tensor([v for _, v in top]), row.topk(k).values, atol=2e-3)
        assert all(abs(row[t].item() - v) < 2e-3 for t, v in top)


def test_prompt_logprobs_walked_in_chunks_past_a_cached_prefix_equal_the_models_log_softmax(engine, reference):
    prompt, lp = reference
    h = engine
    warm = h.submit(prompt, max_tokens=1)  # the prefix cache now holds this very prompt
    assert h.wait(lambda: h.done(warm))
    r = h.submit(prompt, max_tokens=2, prompt_logprobs=3)
    assert h.wait(lambda: h.done(r))
    evs = [e for e in h.events[r.id] if isinstance(e, (PromptLogprobs, Token, Finished))]
    assert isinstance(evs[0], PromptLogprobs) and isinstance(evs[1], Token)  # ahead of the first token
    assert len(h.of(r, PromptLogprobs)) == 1
    _check(evs[0].entries, prompt, lp, 3)
    assert not h.of(warm, PromptLogprobs)  # only a request that asks pays for them


def test_a_request_without_prompt_logprobs_beside_one_with_them_gets_its_tokens_alone(engine, rig):
    r = rig("gemma3-270m", "fp32")
    want = serial.generate(r.runner, r.book, ids(40, 3), 6)
    a = engine.submit(ids(40, 3), max_tokens=6)
    b = engine.submit(ids(90, 4), max_tokens=3, prompt_logprobs=0)
    assert engine.wait(lambda: engine.done(a) and engine.done(b))
    assert engine.tokens(a) == want
    (ev,) = engine.of(b, PromptLogprobs)
    assert len(ev.entries) == 89 and all(top == [] for _, _, top in ev.entries)
