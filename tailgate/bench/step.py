"""`tailgate bench step`: step latency of decode batches and prefill segments against the same
step's weight matmuls alone, for the kernel plan this machine chose and every alternative it can
run, with the CPU's model name and each dtype's matmul peak measured in the same run."""

from __future__ import annotations

import time

import torch

from ..engine.pages import KVBook, SeqPages, pool_pages
from ..engine.plan import Segment
from ..model.kernels.choice import KernelPlan, choose, runnable_plans
from ..model.runtime.runner import ModelRunner
from ..model.spec import ModelSpec


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # CUDA calls return at launch; time the work, not the launch


def matmul_peak(dtype, m=1024, k=2048, n=2048, reps=20, device="cpu") -> float:
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * m * k * n / best


def layer_matmul_params(spec: ModelSpec) -> int:
    """Per-layer head shapes as the spec gives them (Gemma 4's global layers are wider); the MLP
    at spec.ffn (a Gemma 4 double-wide MLP and MoE experts are not counted)."""
    h = spec.hidden
    return sum(
        h * (spec.n_heads + 2 * kv) * d + spec.n_heads * d * h + 3 * h * spec.ffn
        for d, kv in zip(spec.layer_head_dim, spec.layer_kv_heads)
    )


def layer_inputs(spec: ModelSpec, w: dict) -> list[tuple[int, int]]:
    """Per layer, the input widths of the attention output and MLP down projections (they differ
    per layer on Gemma 4: wider global heads, a double-wide MLP on KV-sharing layers)."""
    return [
        (spec.n_heads * spec.layer_head_dim[i], w[f"layers.{i}.gate_up"].out_features // 2)
        for i in range(spec.n_layers)
    ]


def step_flops(spec: ModelSpec, rows: int, sampled: int, attn_pairs: int) -> float:
    """Matmul FLOPs of one step: projections and MLP per row, the head per sampled row, and
    q·k + p·v per (query, key) pair per layer and head."""
    return (
        2 * layer_matmul_params(spec) * rows
        + 2 * spec.hidden * spec.vocab_size * sampled
        + 4 * attn_pairs * spec.n_heads * spec.head_dim
    )


def _time(fn, reps, device="cpu"):
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def alternatives(chosen: KernelPlan) -> list[KernelPlan]:
    """The chosen plan first, then every other plan this machine can run (dense fp32 both ways,
    dense bf16 where oneDNN takes it, int8 and int4 small steps over the chosen dense path)."""
    return [chosen] + [p for p in runnable_plans(chosen.device) if p != chosen]


def run(
    model: str = "gemma3-270m",
    dtype: str = "auto",
    decode_batches=(1, 4, 16, 64),
    prefill_rows=(256, 512),
    context: int = 256,
    reps: int = 5,
    loaded=None,
    kernels: str = "auto",
    compare: bool = True,
    device: str = "cpu",
    mixed=((64, 4), (64, 16)),
) -> list[dict]:
    from ..model.kernels.cpu import this_cpu
    from ..model.formats.weights import load_model

    chosen = choose(dtype, kernels, device)
    m = loaded or load_model(model)
    if chosen.device == "cpu":
        cpu = this_cpu()
        print(f"CPU: {cpu.model} ({cpu.isa}); torch {torch.__version__}; threads={torch.get_num_threads()}")
    else:
        print(f"device: {chosen.cpu} ({chosen.device}); torch {torch.__version__}")
    print(f"chosen {chosen.line()}")
    rows_out = []
    for plan in alternatives(chosen) if compare and chosen.device == "cpu" else [chosen]:
        print(f"\n== {'chosen' if plan == chosen else 'alternative'}: {plan.line()}")
        rows_out += run_plan(m, plan, decode_batches, prefill_rows, context, reps, mixed)
    return rows_out


def run_plan(
    m, plan: KernelPlan, decode_batches, prefill_rows, context: int, reps: int, mixed=((64, 4), (64, 16))
) -> list[dict]:
    spec = m.spec
    max_b = max(decode_batches)
    # A decode row reserves its whole context at once; where that is past the sliding window (a
    # small Gemma 4 test model), the sliding pool needs room for every row's full context.
    short_window = spec.has_sliding and spec.sliding_window < context + 2
    pages = pool_pages(
        max(max(prefill_rows, default=0), context + 2),
        max_b + 1,
        spec.sliding_window,
        transient_prompts=max_b + 2 if short_window else 2,
    )
    runner = ModelRunner(spec, m.weights, pages, plan=plan)
    book = KVBook(pages["global"], pages.get("local"), spec.sliding_window)
    dev = runner.device
    dense = runner.plan.dense_dtype or runner.dtype  # the dtype the big matmuls run in
    peak = matmul_peak(dense, device=dev)
    print(f"matmul peak ({dense}, 1024x2048x2048): {peak / 1e9:.0f} GFLOP/s")
    rows_out = []
    window = spec.sliding_window or 10**9
    n_sl = sum(spec.layer_sliding)
    n_gl = spec.n_layers - n_sl
    name = plan.line().split(" [")[0].removeprefix("kernels: ")

    def report(kind, n, secs, flops, mm, prompt_rows, decode_rows, sampled, raw_pairs):
        # The last four: what the step holds, as the cost form prices it (engine/cost_form.py).
        frac = flops / secs / peak
        rows_out.append(
            {
                "plan": name,
                "kind": kind,
                "n": n,
                "ms": secs * 1e3,
                "matmul_ms": mm * 1e3,
                "gflops": flops / secs / 1e9,
                "peak_frac": frac,
                "prompt_rows": prompt_rows,
                "decode_rows": decode_rows,
                "sampled": sampled,
                "pairs": raw_pairs,
            }
        )
        print(
            f"{kind:9s} {n:5d}  {secs * 1e3:8.1f} ms  {flops / secs / 1e9:7.1f} GFLOP/s  {100 * frac:5.1f}% of peak"
            f"  matmuls alone {mm * 1e3:6.1f} ms ({secs / mm:.2f}x)"
        )

    # Decode: B sequences, each with `context` tokens of KV, one new token each.
    seqs = [SeqPages() for _ in range(max_b)]
    for s in seqs:
        assert book.reserve(s, context + 1)
        s.frontier = context  # KV contents do not matter for timing
    for b in decode_batches:
        segs = [Segment([100], context, s) for s in seqs[:b]]
        secs = _time(lambda: runner.step(segs), reps, dev)
        pairs = b * (n_sl * min(context + 1, window) + n_gl * (context + 1)) // spec.n_layers
        mm = _time(matmuls_only(runner, b, b), reps, dev)
        report("decode", b, secs, step_flops(spec, b, b, pairs), mm, 0, b, b, b * (context + 1))
    # Mixed: one walk round, `chunk` rows of a prompt already `context // 2` tokens in, riding
    # B live decode rows (the step every live stream waits for while a prompt walks in).
    k0 = context // 2
    for chunk, b in mixed:
        w = SeqPages()
        assert book.reserve(w, k0 + chunk)
        w.frontier = k0
        segs = [Segment([100 + i for i in range(chunk)], k0, w, sample=False)] + [
            Segment([100], context, s) for s in seqs[:b]
        ]
        secs = _time(lambda: runner.step(segs), reps, dev)
        pairs = chunk * k0 + chunk * (chunk + 1) // 2 + b * (context + 1)
        mm = _time(matmuls_only(runner, chunk + b, b), reps, dev)
        report(f"mixed+{b}", chunk, secs, step_flops(spec, chunk + b, b, pairs), mm, chunk, b, b, pairs)
        book.free(w)
    for s in seqs:
        book.free(s)
    for n in prefill_rows:
        s = SeqPages()
        assert book.reserve(s, n)
        seg = Segment([100 + i % 1000 for i in range(n)], 0, s)
        secs = _time(lambda: runner.step([seg]), max(2, reps // 2), dev)
        pairs = (n_sl * sum(min(i + 1, window) for i in range(n)) + n_gl * n * (n + 1) // 2) // spec.n_layers
        mm = _time(matmuls_only(runner, n, 1), max(2, reps // 2), dev)
        report("prefill", n, secs, step_flops(spec, n, 1, pairs), mm, n, 0, 1, n * (n + 1) // 2)
        book.free(s)
    return rows_out


def matmuls_only(runner: ModelRunner, rows: int, sampled: int):
    """A call that runs the step's weight matmuls (every layer for every row, the head for the
    sampled rows) with nothing else, through the same kernels (and row-count choice) as the step.
    Its inputs are made here, outside the timed call: drawn inside it, the random numbers cost as
    much as the matmuls (a 256-row prefill's "matmuls alone" read 108 ms where they take ~67,
    AMD EPYC Zen 5)."""
    from ..model.runtime.layers import linear

    spec, w = runner.spec, runner.w
    rnd = lambda n: torch.randn(rows, n, dtype=runner.dtype, device=runner.device)  # noqa: E731
    x = rnd(spec.hidden)
    ins = [(rnd(a), rnd(m)) for a, m in layer_inputs(spec, w)]

    def run() -> None:
        for i, (a, m) in enumerate(ins):
            p = f"layers.{i}."
            linear(x, w[p + "qkv"]), linear(a, w[p + "o"]), linear(x, w[p + "gate_up"]), linear(m, w[p + "down"])
        linear(x[:sampled], w["head"])

    return run
