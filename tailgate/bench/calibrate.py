"""`tailgate sim calibrate`: the simulator's `local` cost preset fitted from `tailgate bench step`
on this machine.

TL;DR: it loads the model and times real steps, so it lives beside `bench step`, not in `sim/`
(the simulator never imports `model`); tailgate.cli runs it for `sim calibrate`.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..engine.cost_form import CostModel, fit
from ..sim.cost import save_preset


def calibrate(args) -> int:
    """Fit a preset (`--preset-name`, `local` by default) from `tailgate bench step` on this machine (the chosen kernel plan):
    decode 1/4/16/64, two walk rounds and prefill 256/512 at 256 keys of context, and decode
    4/16 at 1024 keys (so attention's price is seen apart from the rows')."""
    import torch

    from ..model.formats.weights import load_model
    from ..model.kernels.choice import choose
    from ..model.kernels.cpu import this_cpu
    from ..model.runtime.kv_cache import token_bytes
    from .step import run as step_run

    m = load_model(args.calibrate_model)
    rows = step_run(args.calibrate_model, loaded=m, compare=False, reps=3)
    rows += step_run(
        args.calibrate_model,
        loaded=m,
        compare=False,
        reps=3,
        decode_batches=(4, 16),
        prefill_rows=(),
        context=480,
        mixed=(),
    )
    cpu = this_cpu()
    model, errors = fit(rows, m.spec.sliding_window, "")
    worst = max(abs(e["error_pct"]) for e in errors)
    source = (
        f"`tailgate sim calibrate`: least squares over `tailgate bench step` ({Path(args.calibrate_model).name}, chosen "
        f"kernels) on {cpu.model} ({cpu.isa}), torch {torch.__version__}, {time.strftime('%Y-%m-%d')}; "
        f"worst fit error {worst:.0f} % over {len(rows)} steps"
    )
    kv = token_bytes(m.spec, choose("auto", "auto", "cpu").kv)
    model = CostModel(
        **{
            **vars(model),
            "source": source + "; kv_token_bytes: this model's KV at the plan's dtype",
            "kv_token_bytes": kv,
        }
    )
    for e in errors:
        print(
            f"{e['kind']:9s} {e['n']:5d}  measured {e['ms']:8.1f} ms  fit {e['fit_ms']:8.1f} ms  {e['error_pct']:+6.1f} %"
        )
    name = args.preset_name
    save_preset(name, model)
    print(f"{name} preset: {model}")
    return 0
