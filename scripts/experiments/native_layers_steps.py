"""Decode steps with their layers in one native call (runtime/native_layers.py) against the Python
layer loop, alternated in one process, after checking the two give the same logits bit for bit
(docs/kernels.md, "A decode step's layers in one native call"). ROWS decode rows at 256 keys each:
    ROWS=1 .venv/bin/python scripts/experiments/native_layers_steps.py MODEL
prints each way's median step and the median of native / Python over the alternated pairs."""

import os
import statistics
import sys
import time

import torch

from tailgate.engine.pages import KVBook, SeqPages, pool_pages
from tailgate.engine.plan import Segment
from tailgate.model.formats.weights import load_model
from tailgate.model.kernels.choice import choose
from tailgate.model.runtime import native_layers
from tailgate.model.runtime.runner import ModelRunner


def main() -> None:
    m = load_model(sys.argv[1])
    rows, n, rounds = (int(os.environ.get(k, v)) for k, v in (("ROWS", "1"), ("N", "8"), ("ROUNDS", "12")))
    pages = pool_pages(2000, 20, m.spec.sliding_window, transient_prompts=2)
    runner = ModelRunner(m.spec, m.weights, pages, plan=choose("auto", "auto", "cpu"))
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    segs = []
    for r in range(rows):
        seq = SeqPages()
        book.reserve(seq, 300)
        seq.frontier = 256
        segs.append(Segment([100 + r], 256, seq))
    logits = {}
    for on in (False, True, False):
        native_layers.ENABLED = on
        logits.setdefault(on, []).append(runner.step(segs).clone())
    same = all(torch.equal(a, logits[True][0]) for a in logits[False])
    print(f"logits bit-equal with and without the native layers: {same}")
    times: dict[bool, list[float]] = {False: [], True: []}
    for rnd in range(rounds):
        for on in (False, True) if rnd % 2 == 0 else (True, False):
            native_layers.ENABLED = on
            runner.step(segs)
            t = time.perf_counter()
            for _ in range(n):
                runner.step(segs)
            times[on].append((time.perf_counter() - t) / n)
    ratios = [a / b for a, b in zip(times[True], times[False])]
    print(
        f"decode {rows}: Python loop {statistics.median(times[False]) * 1e3:.2f} ms, native"
        f" {statistics.median(times[True]) * 1e3:.2f} ms; native / Python median {statistics.median(ratios):.3f}"
        f" ({min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} pairs)"
    )


if __name__ == "__main__":
    main()
