"""Whole steps two ways in one process, alternated, after checking both give the same logits:
  prefetch       the q8 panels' weights four blocks ahead into L1 (A) or 32 KB ahead into L2 (B)
                 (csrc/q8.c `q8_prefetch_far`; docs/kernels.md, "The panels' weights prefetched
                 into L2")
  native_layers  a step's layers through the Python loop (A) or in one native call (B)
                 (runtime/native_layers.py; docs/kernels.md, "A step's layers in one native call")
  rope_rows      each step's RoPE cos / sin computed (A, `rope_tables`) or read from the cached
                 table of every position (B, `rope_rows`; runtime/layers.py)
  six_layers     the layers' Q6_K matrices as int8 panels (A) or in their 6 bits (B) on this CPU's
                 panel variant (choice.six_bits; two runners of one model, each its own weights)
ROWS decode rows at 256 keys each, and / or a chunk of PROMPT rows of one prompt from START (its
earlier rows prefilled first; ROWS defaults to 0 with a PROMPT, else 1):
    ROWS=4 .venv/bin/python scripts/experiments/step_ab.py prefetch MODEL
    PROMPT=256 N=2 ROUNDS=6 .venv/bin/python scripts/experiments/step_ab.py prefetch MODEL
    PROMPT=64 START=128 ROWS=4 .venv/bin/python scripts/experiments/step_ab.py native_layers MODEL
    ROWS=1 .venv/bin/python scripts/experiments/step_ab.py native_layers MODEL
prints each way's median step and the median of B / A over the alternated pairs."""

import os
import statistics
import sys
import time

import torch

from tailgate.engine.pages import KVBook, SeqPages, pool_pages
from tailgate.engine.plan import Segment
from tailgate.model.formats.weights import load_model
from tailgate.model.kernels import native
from tailgate.model.kernels.choice import choose
from tailgate.model.families import gemma3_forward, gemma4_forward, llama_forward
from tailgate.model.runtime import layers, native_layers
from tailgate.model.runtime.runner import ModelRunner


def _native_layers(on: bool) -> None:
    native_layers.ENABLED = on


def _rope_rows(on: bool) -> None:
    for family in (llama_forward, gemma3_forward, gemma4_forward):
        family.rope_rows = layers.rope_rows if on else layers.rope_tables


def _six_runner(m, pages) -> ModelRunner:
    from tailgate.model.kernels import choice

    real = choice.six_bits
    choice.six_bits = lambda variant, group: True
    try:
        return ModelRunner(m.spec, m.weights, pages, plan=choose("auto", "auto", "cpu"))
    finally:
        choice.six_bits = real


class _Switched:
    """Two runners behind one `step`, the switch picking which."""

    def __init__(self, runners):
        self.runners, self.on = runners, False

    def switch(self, on: bool) -> None:
        self.on = on

    def step(self, segs):
        return self.runners[self.on].step(segs)


MODES = {
    "six_layers": lambda on: None,  # (the switch is _Switched's)
    "prefetch": lambda far: native._LIB.q8_prefetch_far(int(far)),
    "native_layers": _native_layers,
    "rope_rows": _rope_rows,
}


def main() -> None:
    mode, model = sys.argv[1], sys.argv[2]
    if mode not in MODES:
        raise SystemExit(f"mode: one of {', '.join(MODES)}, not {mode!r}")
    switch = MODES[mode]
    prompt = int(os.environ.get("PROMPT", "0"))
    rows, start = int(os.environ.get("ROWS", "0" if prompt else "1")), int(os.environ.get("START", "0"))
    n, rounds = int(os.environ.get("N", "8")), int(os.environ.get("ROUNDS", "12"))
    m = load_model(model)
    pages = pool_pages(2000, 20, m.spec.sliding_window, transient_prompts=2)
    runner = ModelRunner(m.spec, m.weights, pages, plan=choose("auto", "auto", "cpu"))
    if mode == "six_layers":  # B: a second runner whose layers keep Q6_K in 6 bits
        runners = {False: runner, True: _six_runner(m, pages)}
        proxy = _Switched(runners)
        switch, runner = proxy.switch, proxy
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    segs = []
    if prompt:  # a walk round's chunk: rows [START, START + PROMPT) of a prompt, its keys before it in the pool
        seq = SeqPages()
        book.reserve(seq, start + prompt + 8)
        if start:
            runner.step([Segment(list(range(100, 100 + start)), 0, seq)])
        segs.append(Segment(list(range(100 + start, 100 + start + prompt)), start, seq))
    for r in range(rows):  # live rows at 256 keys each
        seq = SeqPages()
        book.reserve(seq, 256 + 8)
        seq.frontier = 256
        segs.append(Segment([100 + r], seq.frontier, seq))
    logits = []
    for b in (False, True, False):
        switch(b)
        logits.append(runner.step(segs).clone())
    print(f"logits bit-equal both ways: {all(torch.equal(x, logits[1]) for x in logits)}")
    times: dict[bool, list[float]] = {False: [], True: []}
    for rnd in range(rounds):
        for b in (False, True) if rnd % 2 == 0 else (True, False):
            switch(b)
            runner.step(segs)
            t = time.perf_counter()
            for _ in range(n):
                runner.step(segs)
            times[b].append((time.perf_counter() - t) / n)
    ratios = [y / x for x, y in zip(times[False], times[True])]
    what = ", ".join(
        ([f"prompt rows {start}-{start + prompt}"] if prompt else []) + ([f"decode {rows}"] if rows else [])
    )
    print(
        f"{mode}, {what}: A {statistics.median(times[False]) * 1e3:.2f} ms, B {statistics.median(times[True]) * 1e3:.2f}"
        f" ms; B / A median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} pairs)"
    )


if __name__ == "__main__":
    main()
