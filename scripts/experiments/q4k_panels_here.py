"""Issue 45 item 2's first look: a GGUF model's step times under this CPU's q8 panel variant against
the AVX2 panels, which keep Q4_K matrices in their own 4 bits (docs/benchmarks/sizes.md), on the
same machine, with the process's peak RSS. `six` is this CPU's variant with a Q4_K_M file's layer
Q6_K matrices (half the v and down) in their own 6 bits too, as the head's (docs/kernels.md, "The
head's Q6_K in 6 bits"; sizes.md's 4B section measured it against `auto`).

    .venv/bin/python scripts/experiments/q4k_panels_here.py MODEL.gguf avx2|auto|six
"""

import sys
import dataclasses
import resource
from tailgate.model.kernels import blocks
from tailgate.model.kernels.choice import choose
from tailgate.model.formats.weights import load_model
from tailgate.bench.step import run_plan

path, variant = sys.argv[1], sys.argv[2]
if variant == "six":
    in_bits = blocks._in_bits
    blocks._in_bits = lambda p, six: in_bits(p, True)  # every matrix as the head: Q6_K kept in 6 bits
m = load_model(path)
plan = choose("auto", "auto", "cpu")
if variant not in ("auto", "six"):
    plan = dataclasses.replace(plan, q8_variant=variant)
print(variant, plan.line())
run_plan(m, plan, (1, 4, 8), (256,), 256, 5, mixed=((64, 4),))
print("maxrss MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
