"""Experiment behind docs/kernels.md ("Tried and not taken"): oneDNN fp32 vs torch._int_mm vs FBGEMM
dynamic int8 for the 18 layers' matmuls of Gemma 3 270M (random weights, real shapes), 2 threads.
Run: .venv/bin/python scripts/experiments/w8a8_speed.py"""

import torch
import time

torch.set_num_threads(2)
shapes = [(640, 1024), (640, 256), (640, 256), (1024, 640), (640, 2048), (640, 2048), (2048, 640)]


def bench(f, reps=5):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1000


for M in (16, 64, 128, 256):
    xs = [torch.randn(M, k) for k, n in shapes]
    ws = [torch.randn(n, k) * 0.02 for k, n in shapes]
    pk = [torch.ops.mkldnn._reorder_linear_weight(w, M) for w in ws]

    def dense():
        for x, w in zip(xs, pk):
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    # int_mm
    wq = [torch.round(w / (w.abs().amax(1, keepdim=True) / 127)).to(torch.int8).t().contiguous() for w in ws]
    xq = [torch.round(x / (x.abs().amax(1, keepdim=True) / 127)).to(torch.int8) for x in xs]

    def intmm():
        for x, w in zip(xq, wq):
            torch._int_mm(x, w)

    # fbgemm dynamic
    torch.backends.quantized.engine = "fbgemm"
    pp = []
    for w in ws:
        s = w.abs().amax(1) / 127
        q = torch.quantize_per_channel(w, s.double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        pp.append(torch.ops.quantized.linear_prepack(q, None))

    def fb():
        for x, p in zip(xs, pp):
            torch.ops.quantized.linear_dynamic(x, p, True)

    r = [M, bench(dense) * 18]
    try:
        r.append(bench(intmm) * 18)
    except Exception as e:
        r.append(repr(e)[:80])
    try:
        r.append(bench(fb) * 18)
    except Exception as e:
        r.append(repr(e)[:80])
    print(
        "M=%d dense %.1f  int_mm %s  fbgemm_dyn %s ms (18 layers)"
        % tuple([r[0], r[1]] + [(f"{v:.1f}" if isinstance(v, float) else v) for v in r[2:]]),
        flush=True,
    )
