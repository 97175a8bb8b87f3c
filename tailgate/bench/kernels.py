"""`tailgate bench kernels`: the crossover table behind the kernel choice, on this machine.

For every kernel this CPU can run (dense oneDNN / F.linear in fp32, dense oneDNN bf16 where the
CPU takes it, int8 and int4 weight-only with every call quantized), the milliseconds of the
model's layer matmuls (every layer's fused qkv, o, gate_up, down) and of the head, by rows M.
`kernels.QUANT_ROWS` holds the cuts this table gave on the CPUs we measured.
"""

from __future__ import annotations

import dataclasses

import torch

from ..model.kernels.choice import EVERY, KernelPlan, runnable_plans
from ..model.runtime.layers import linear
from ..model.runtime.runner import prepare_weights
from .step import _time, layer_inputs


def plans(device: str = "cpu") -> list[tuple[str, KernelPlan]]:
    out = []
    for p in runnable_plans(device):
        if p.quant:  # every call quantized: the table shows where each kernel wins
            out.append((p.quant, dataclasses.replace(p, quant_rows=(EVERY, EVERY))))
        else:
            dt = str(p.dtype).removeprefix("torch.").replace("float32", "fp32").replace("bfloat16", "bf16")
            out.append((f"{dt} {'oneDNN' if p.dense == 'onednn' else 'F.linear'}", p))
    return out


def run(model: str = "gemma3-270m", rows=(1, 4, 16, 64, 256), head_rows_max: int = 64, reps: int = 3) -> list[dict]:
    from ..model.kernels.cpu import this_cpu
    from ..model.formats.weights import load_model

    m = load_model(model)
    spec = m.spec
    cpu = this_cpu()
    print(f"CPU: {cpu.model} ({cpu.isa}); torch {torch.__version__}; threads={torch.get_num_threads()}")
    print(f"{'kernel':16s} {'M':>5s} {'layers ms':>10s} {'head ms':>9s}")
    out = []
    for name, plan in plans():
        w = prepare_weights(m.weights, spec, plan)
        for n in rows:
            x = torch.randn(n, spec.hidden, dtype=plan.dtype)
            ins = [
                (torch.randn(n, a, dtype=plan.dtype), torch.randn(n, f, dtype=plan.dtype))
                for a, f in layer_inputs(spec, w)
            ]

            def layers():
                for i, (a, f) in enumerate(ins):
                    p = f"layers.{i}."
                    linear(x, w[p + "qkv"])
                    linear(a, w[p + "o"])
                    linear(x, w[p + "gate_up"])
                    linear(f, w[p + "down"])

            lt = _time(layers, reps) * 1e3
            ht = _time(lambda: linear(x, w["head"]), reps) * 1e3 if n <= head_rows_max else float("nan")
            out.append({"kernel": name, "rows": n, "layers_ms": lt, "head_ms": ht})
            print(f"{name:16s} {n:5d} {lt:10.1f} {ht:9.1f}", flush=True)
        w = ins = None  # this plan's weights go before the next plan's are built
    return out
