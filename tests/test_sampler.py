"""Sampling: filters are exact, seeds reproduce, greedy is argmax."""
from __future__ import annotations

import torch

from tailgate.model.sampler import SamplingParams, filter_logits, make_generator, sample


def test_greedy_rows_take_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]])
    assert sample(logits, [SamplingParams(), SamplingParams(temperature=1.0, top_k=1)], [None, None]) == [1, 0]


def test_the_same_seed_draws_the_same_tokens():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0, seed=7)
    draw = lambda: [sample(logits, [p], [g])[0] for g in [make_generator(7)] for _ in range(20)]  # noqa: E731
    a, b = draw(), draw()
    assert a == b and len(set(a)) > 1


def test_top_k_top_p_and_min_p_keep_exactly_the_expected_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    kept = lambda p: torch.isfinite(filter_logits(logits, [p]))[0].tolist()  # noqa: E731
    assert kept(SamplingParams(temperature=1.0, top_k=2)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.7)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.75)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.76)) == [True, True, True, False]
    assert kept(SamplingParams(temperature=1.0, min_p=0.3)) == [True, True, True, False]


def test_a_top_p_that_rounds_to_zero_keeps_the_top_token():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))  # 5e-324 is a valid top_p and 0.0 in fp32
    assert torch.isfinite(filter_logits(logits, [SamplingParams(temperature=1.0, top_p=5e-324)]))[0].tolist() == \
        [False, True, False]
    assert sample(logits, [SamplingParams(temperature=1.0, top_p=5e-324)], [make_generator(0)]) == [1]


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log()[None, :]
    g = make_generator(123)
    p = SamplingParams(temperature=1.0)
    counts = torch.bincount(torch.tensor([sample(logits, [p], [g])[0] for _ in range(3000)]), minlength=3)
    freq = counts.float() / 3000
    assert (freq - probs).abs().max() < 0.03
