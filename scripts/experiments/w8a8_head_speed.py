"""Experiment behind docs/kernels.md: the 262144x640 head, FBGEMM dynamic int8 vs oneDNN fp32 by rows.
Run: .venv/bin/python scripts/experiments/w8a8_head_speed.py"""

import torch
import time

torch.set_num_threads(2)
torch.backends.quantized.engine = "fbgemm"
w = torch.randn(262144, 640) * 0.03
s = w.abs().amax(1) / 127
qw = torch.quantize_per_channel(w, s.double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
p = torch.ops.quantized.linear_prepack(qw, None)
pk = torch.ops.mkldnn._reorder_linear_weight(w, 8)


def bench(f, reps=5):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1000


for M in (1, 4, 8, 16, 32, 64):
    x = torch.randn(M, 640)
    print(
        M,
        "fbgemm %.1f" % bench(lambda: torch.ops.quantized.linear_dynamic(x, p, True)),
        "onednn fp32 %.1f" % bench(lambda: torch.ops.mkldnn._linear_pointwise(x, pk, None, "none", [], "")),
        flush=True,
    )
