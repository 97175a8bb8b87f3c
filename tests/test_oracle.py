"""Our logits against HF transformers' own implementation of the same GGUF weights (fp32)."""
from __future__ import annotations

import pytest
import torch

from tailgate.model import serial
from tailgate.model.check import MEAN_TOL, P99_TOL, PROMPTS, compare  # the tolerances `tailgate check` uses
from conftest import LONG_TEXT, MODELS


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
        c = compare(ours, ref)
        print(f"{name} len={len(ids)} mean|Δ|={c.mean:.2e} p99={c.p99:.2e} max={c.max:.2e} regret={c.regret:.3f}")
        assert c.mean < MEAN_TOL and c.p99 < P99_TOL
        assert c.regret <= 0.2
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
