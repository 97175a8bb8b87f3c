"""Issue 45 item 2's first look: a GGUF model's step times under this CPU's q8 panel variant against
the AVX2 panels, which keep Q4_K matrices in their own 4 bits (docs/benchmarks/sizes.md), on the
same machine, with the process's peak RSS.

    .venv/bin/python scripts/experiments/q4k_panels_here.py MODEL.gguf avx2|auto
"""

import sys
import dataclasses
import resource
from tailgate.model.kernels.choice import choose
from tailgate.model.formats.weights import load_model
from tailgate.bench.step import run_plan

path, variant = sys.argv[1], sys.argv[2]
m = load_model(path)
plan = choose("auto", "auto", "cpu")
if variant != "auto":
    plan = dataclasses.replace(plan, q8_variant=variant)
print(plan.line())
run_plan(m, plan, (1, 4), (256,), 256, 3, mixed=((64, 4),))
print("maxrss MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
