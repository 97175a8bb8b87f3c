"""A GGUF file's Q6_K layer matrices timed in both forms this CPU's plan can hold them in: int8
panels quantized from them (codes 2 / 0) and their own 6 bits (AVX-512 VNNI: code 9, csrc/q8.c
wide6_rows; AVX2: code 10, the same panels by halves, q6h_rows).

    .venv/bin/python scripts/experiments/q6k_calls.py FILE.gguf [ROWS ...]

Each matrix is called once per pass, all of them in turn, so a pass streams every matrix from
memory as a decode step does (a 3B file's are 310 MiB, past any cache); best of three passes per
form and row count, the forms alternated. Prints ms per pass and the 6-bit / int8 ratio. Needs a CPU
with AVX-512 VNNI or AVX2 (docs/kernels.md, "A layer's Q6_K in 6 bits")."""

from __future__ import annotations

import sys
import time

import gguf
import numpy as np
import torch

from tailgate.model.kernels import blocks
from tailgate.model.kernels.cpu import this_cpu


def main(path: str, rows: list[int]) -> None:
    variant = {"amx": "avx512_vnni"}.get(this_cpu().q8_variant, this_cpu().q8_variant)
    if variant not in ("avx512_vnni", "avx2"):
        sys.exit(f"needs AVX-512 VNNI or AVX2 panels; this CPU's q8 variant is {this_cpu().q8_variant}")
    reader = gguf.GGUFReader(path)
    found = [t for t in reader.tensors if t.tensor_type.name == "Q6_K" and t.name.startswith("blk.")]
    if not found:
        sys.exit(f"{path}: no Q6_K layer matrices")
    forms: dict[str, list] = {"int8": [], "6-bit": []}
    for t in found:
        n, k = int(t.shape[1]), int(t.shape[0])
        b = blocks.Blocks(np.asarray(t.data).reshape(n, -1), "Q6_K", (n, k))
        forms["int8"].append((k, blocks.q8_panels([b], variant, 16)))
        forms["6-bit"].append((k, blocks.q8_panels([b], variant, 16, six=True)))
    stored = sum(int(t.n_bytes) for t in found) >> 20
    print(f"{len(found)} Q6_K layer matrices, {stored} MiB stored; {this_cpu().model}; ms per pass")
    for m in rows:
        xs = {k: torch.randn(m, k) for k, _ in forms["int8"]}
        best: dict[str, float] = {}
        for _ in range(3):
            for name, mats in forms.items():
                t0 = time.perf_counter()
                for k, p in mats:
                    p.linear(xs[k])
                best[name] = min(best.get(name, float("inf")), (time.perf_counter() - t0) * 1e3)
        print(
            f"rows {m:4d}  int8 {best['int8']:8.2f}  6-bit {best['6-bit']:8.2f}  6-bit/int8 {best['6-bit'] / best['int8']:.2f}"
        )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], [int(r) for r in sys.argv[2:]] or [1, 2, 4, 8, 16, 64])
