"""Resident weights under the plan each CPU class chooses, counted from the plan's forms with a
faked CPU (issue 35: resident weights <= 1.5x the model file on every class).

    .venv/bin/python scripts/experiments/resident_by_class.py [MODEL]

For each class (its real cpuinfo flags, as tests/test_kernels.py has them) `choice.choose` gives
the plan; the weights are prepared as `ModelRunner` prepares them (the panels of the class's
variant are built here whatever this CPU is: building them is layout only, running the AMX or
VNNI ones needs that CPU) and `assemble.resident_line`'s counts are printed beside the file's
size. Only this machine's own class is also measured by the server's log line.
"""

from __future__ import annotations

import sys

from tailgate.model.kernels.cpu import parse_cpuinfo
from tailgate.model.kernels.choice import choose
from tailgate.model.runtime.runner import prepare_weights, resident_bytes
from tailgate.model.formats.weights import load_model

CLASSES = {
    "AMD EPYC Zen 3 (AVX2)": "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma f16c avx avx2\n",
    "AMD EPYC Zen 5 (AVX-512 BF16, VNNI)": "model name\t: AMD EPYC 9B45\nflags\t\t: fma f16c avx avx2 avx_vnni avx512f "
    "avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni\n",
    "Intel Xeon (AMX)": "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: avx avx2 fma f16c avx512f avx512bw "
    "avx512vl avx512dq avx512_bf16 avx512_vnni avx_vnni amx_bf16 amx_tile amx_int8\n",
}


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"
    m = load_model(name, log=lambda _: None)
    size = m.source.stat().st_size
    mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
    for cls, text in CLASSES.items():
        plan = choose(
            cpu=parse_cpuinfo(text),
            mkldnn=True,
            cuda=False,
            native_build=lambda: (object(), None),
            amx_grant=lambda: True,
        )
        w = prepare_weights(m.weights, m.spec, plan)
        held = resident_bytes(w)
        total = held["kernels"] + held["tensors"]
        print(
            f"{cls:38s} {plan.quant} ({plan.q8_variant} panels): {mib(total)} resident "
            f"({mib(held['kernels'])} kernels' forms, {mib(held['tensors'])} other, {mib(held['mapped'])} mapped "
            f"for lookups) for a {mib(size)} file: {total / size:.2f}x"
        )
        del w
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
