"""Our logits against HF transformers' own implementation of the same GGUF weights (fp32)."""
from __future__ import annotations

import pytest
import torch

from tailgate.model import serial
from conftest import LONG_TEXT, MODELS

# Measured floor (fp32, same dequantized weights, 2-core CPU): mean |Δ logprob| ≈ 1e-6 and
# p99 ≈ 1e-5 for both models; the tolerances are ~20x that to absorb BLAS blocking differences.
MEAN_TOL = 1e-4
P99_TOL = 5e-4

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
]


def sequences(tok):
    long_ids = tok.encode(LONG_TEXT * 12)[:700]  # longer than Gemma's 512-token window
    return [tok.encode(p) for p in PROMPTS] + [long_ids]


@pytest.mark.parametrize("name", MODELS)
def test_teacher_forced_logprobs_match_hf(name, rig, hf_model):
    r = rig(name, "fp32")
    hf = hf_model(name)
    for ids in sequences(r.model.tokenizer):
        ours = torch.log_softmax(serial.teacher_forced_logits(r.runner, r.book, ids), -1)
        with torch.inference_mode():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        diff = (ours - ref).abs()
        per_pos = diff.mean(-1)
        mean, p99 = diff.mean().item(), torch.quantile(per_pos, 0.99).item()
        top = ref.argmax(-1)
        regret = (ref.gather(-1, top[:, None]) - ref.gather(-1, ours.argmax(-1)[:, None])).max().item()
        print(f"{name} len={len(ids)} mean|Δ|={mean:.2e} p99={p99:.2e} max={diff.max().item():.2e} regret={regret:.3f}")
        assert mean < MEAN_TOL and p99 < P99_TOL
        assert regret <= 0.2
    r.assert_no_leak()


@pytest.mark.parametrize("name", MODELS)
def test_greedy_continuation_matches_hf_generate(name, rig, hf_model):
    r = rig(name, "fp32")
    hf = hf_model(name)
    tok = r.model.tokenizer
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        ours = serial.generate(r.runner, r.book, ids, 32)  # no EOS stop: compare 32 tokens
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
        # HF stops after an EOS (and pads); we were told no EOS ids, so compare up to HF's stop.
        assert len(out) >= 8 and ours[:len(out)] == out, prompt
    r.assert_no_leak()
