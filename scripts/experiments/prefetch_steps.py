"""Whole steps with the q8 panels' weights prefetched near (four blocks into L1) or far (32 KB into
L2), alternated in one process (csrc/q8.c `q8_prefetch_far`; docs/kernels.md, "The panels' weights
prefetched into L2"). Decode rows at 256 keys each, or one prompt:
    ROWS=4 .venv/bin/python scripts/experiments/prefetch_steps.py MODEL
    PROMPT=256 N=2 ROUNDS=6 .venv/bin/python scripts/experiments/prefetch_steps.py MODEL
prints each mode's median step and the median of far / near over the alternated pairs."""

import os
import statistics
import sys
import time

from tailgate.engine.pages import KVBook, SeqPages, pool_pages
from tailgate.engine.plan import Segment
from tailgate.model.formats.weights import load_model
from tailgate.model.kernels import native
from tailgate.model.kernels.choice import choose
from tailgate.model.runtime.runner import ModelRunner


def main() -> None:
    m = load_model(sys.argv[1])
    rows, prompt = int(os.environ.get("ROWS", "1")), int(os.environ.get("PROMPT", "0"))
    n, rounds = int(os.environ.get("N", "8")), int(os.environ.get("ROUNDS", "12"))
    pages = pool_pages(2000, 20, m.spec.sliding_window, transient_prompts=2)
    runner = ModelRunner(m.spec, m.weights, pages, plan=choose("auto", "auto", "cpu"))
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    segs = []
    for r in range(1 if prompt else rows):
        seq = SeqPages()
        book.reserve(seq, (prompt or 256) + 8)
        seq.frontier = 0 if prompt else 256
        segs.append(Segment(list(range(100, 100 + prompt)) if prompt else [100 + r], seq.frontier, seq))
    for _ in range(3):
        runner.step(segs)
    times: dict[int, list[float]] = {0: [], 1: []}
    for rnd in range(rounds):
        for far in (0, 1) if rnd % 2 == 0 else (1, 0):
            native._LIB.q8_prefetch_far(far)
            runner.step(segs)
            t = time.perf_counter()
            for _ in range(n):
                runner.step(segs)
            times[far].append((time.perf_counter() - t) / n)
    ratios = [f / near for near, f in zip(times[0], times[1])]
    what = f"prompt {prompt}" if prompt else f"decode {rows}"
    print(
        f"{what}: near {statistics.median(times[0]) * 1e3:.2f} ms, far {statistics.median(times[1]) * 1e3:.2f} ms;"
        f" far / near median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} pairs)"
    )


if __name__ == "__main__":
    main()
