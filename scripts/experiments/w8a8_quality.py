"""Experiment behind docs/kernels.md: teacher-forced quality of FBGEMM dynamic int8 (W8A8) vs fp32.
Run: MODE=row|rowfold|"" .venv/bin/python scripts/experiments/w8a8_quality.py MODEL REDUCE_RANGE(0|1) WHICH
(WHICH: layers | head | qkv | gate_up | down | o). Quantized passes run in CHUNK-row pieces (env CHUNK, default 16; 0 = the whole sequence at once)."""

import os
import sys
import torch
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
torch.set_num_threads(2)
from conftest import Rig
from tailgate.model.formats.weights import load_model
from tailgate.model.runtime import serial
from tailgate.model.kernels.choice import Linear
from test_oracle import PROMPTS, sequences

torch.backends.quantized.engine = "fbgemm"
name = sys.argv[1]
rr = sys.argv[2] == "1"
which = sys.argv[3] if len(sys.argv) > 3 else "all"
m = load_model(name, log=lambda s: None)
ref = Rig(m, "fp32")
q = Rig(m, "fp32")

MODE = os.environ.get("MODE", "")


class Dyn:
    def __init__(self, lin, w):
        self.g = None
        if "fold" in MODE:
            self.g = m.weights["final_norm"].float().clone()
            w = w * self.g[None, :]
        s = (w.abs().amax(1) / 127).clamp(min=1e-12)
        qw = torch.quantize_per_channel(w, s.double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        self.p = torch.ops.quantized.linear_prepack(qw, None)
        self.lin = lin
        self.out_features = lin.out_features

    def __call__(self, x):
        if self.g is not None:
            x = x / self.g
        if "row" in MODE:
            a = x.abs().amax(-1, keepdim=True).clamp(min=1e-12)
            return torch.ops.quantized.linear_dynamic(x / a, self.p, rr) * a
        return torch.ops.quantized.linear_dynamic(x, self.p, rr)


from tailgate.model.runtime.runner import prepare_weights

raw = m.weights
# reconstruct dense fp32 weights from the packed? take from raw via prepare on fp32 torch plan
from tailgate.model.kernels.choice import choose

dense = prepare_weights(raw, m.spec, choose("fp32", "torch", "cpu"))
n = 0
for k, v in list(q.runner.w.items()):
    if (
        isinstance(v, Linear)
        and ((which == "head") == (k == "head"))
        and (which in ("layers", "head") or k.endswith(which))
    ):
        q.runner.w[k] = Dyn(v, dense[k].w)
        n += 1
print("replaced", n)
means, p99s, kls, agree = [], [], [], []
for ids in sequences(ref.model.tokenizer):
    a = torch.log_softmax(serial.teacher_forced_logits(ref.runner, ref.book, ids).float(), -1)
    b = torch.log_softmax(
        serial.teacher_forced_logits(q.runner, q.book, ids, chunk=int(os.environ.get("CHUNK", "16")) or None).float(),
        -1,
    )
    d = (a - b).abs().mean(-1)
    means.append(d.mean().item())
    p99s.append(torch.quantile(d, 0.99).item())
    kls.append((a.exp() * (a - b)).sum(-1).mean().item())
for p in PROMPTS:
    ids = ref.model.tokenizer.encode(p)
    x, y = serial.generate(ref.runner, ref.book, ids, 32), serial.generate(q.runner, q.book, ids, 32)
    agree.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), 32))
print(name, "reduce_range", rr, which, "mean", sum(means) / len(means), "p99", max(p99s), "KL", max(kls), agree)
