"""Every tensor a step creates names its device: the guard that keeps the CUDA path working on a
host with no GPU (tests/device_guard.py says why a CPU run cannot see the bug otherwise)."""

from __future__ import annotations

import pytest
import torch

from tailgate.engine.pages import SeqPages
from tailgate.engine.plan import Segment
from tailgate.model.runtime.sampler import SamplingParams, apply_penalties, filter_logits, make_generator, sample
from device_guard import DeviceGuard


def guarded_steps(runner, book, window: int | None) -> DeviceGuard:
    """A fresh prompt, a walk chunk past the sliding window beside a decode row (masked prompt
    attention, the native or torch decode path), then a decode step of two rows, all under the guard."""
    n = (window or 32) + 24
    a, b = SeqPages(), SeqPages()
    guard = DeviceGuard(runner.device)
    try:
        assert book.reserve(a, 20) and book.reserve(b, n + 2)
        with guard:
            runner.step([Segment(list(range(10, 28)), 0, a)])
            runner.step([Segment(list(range(30, 30 + n - 8)), 0, b, sample=False)])
            runner.step([Segment(list(range(40, 48)), n - 8, b), Segment([5], 18, a)])
            runner.step([Segment([6], n, b), Segment([7], 19, a)])
    finally:
        book.free(a), book.free(b)
    return guard


@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
@pytest.mark.parametrize("dtype,kernels", [("auto", "auto"), ("fp32", "torch")])
def test_a_step_creates_every_tensor_on_its_own_device(name, dtype, kernels, rig):
    r = rig(name, dtype, kernels)
    guard = guarded_steps(r.runner, r.book, r.model.spec.sliding_window if r.model.spec.has_sliding else None)
    assert guard.deviceless == [] and guard.elsewhere == []
    r.assert_no_leak()


def test_the_sampler_creates_its_tensors_on_the_logits_device():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(
        temperature=0.8,
        top_k=5,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=0.3,
    )
    guard = DeviceGuard("cpu")
    with guard:
        x = apply_penalties(logits[0], p, [1, 2, 3], [3, 4, 4])
        filter_logits(torch.stack([x, logits[1]]), [p, p])
        sample(logits, [p, SamplingParams()], [make_generator(1), None])
    assert guard.deviceless == []


def test_the_guard_catches_a_factory_without_a_device(rig, monkeypatch):
    """The mutation the guard exists for: the attention output allocated without q's device (the
    bug that broke the CUDA path once)."""
    from tailgate.model.runtime import layers

    real = torch.empty
    monkeypatch.setattr(layers.torch, "empty", lambda *a, device=None, **kw: real(*a, **kw))
    r = rig("gemma3-270m", "fp32", "torch")
    guard = guarded_steps(r.runner, r.book, r.model.spec.sliding_window)
    assert any("torch.empty at tailgate/model/runtime/layers.py" in d for d in guard.deviceless), guard.deviceless
