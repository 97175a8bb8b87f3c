"""The start-up probe: a few step shapes timed on the CPU the engine runs on, so the inter-token
target starts from this machine's costs instead of a table measured on another CPU class.

Every decision that depends on how fast a step is (the inter-token target's round widths, its
TTFT horizon) used to learn the step's price only from live traffic, starting from the fixed
walk; and the row cuts and the `auto` rule were tuned on whichever class a developer drew
(issue 35: on the AMX Xeon the Zen 3 rule cost 15-38 % of the walk's throughput). Here, after the
warm-up step, the runner times SHAPES (decode rows alone, walk rounds of 32 and 64 prompt rows
riding 8 decode rows, a 128-row prefill) through scratch pages, each the fastest of REPS runs; the
rows fit the cost form the simulator shares (`cost_form.fit`), and:
- the engine's step-cost model is seeded with them (`seed`), so the target prices the first round
  with this CPU's numbers (it still learns from every live step and forgets the probe);
- the fit and its worst error are logged in one line beside the kernels line, and shown in
  `/version`; a CPU whose steps the linear form cannot follow (worst error over TRUST_FIT) leaves
  the target on the fixed walk until live steps say otherwise (`step_cost.StepCostModel.trusted`).

A plan with a row cut (`--kernels q8` beside dense weights) first races its layers' two kernels
on layer 0's matrices at CUT_ROWS and sets the cut it measured (`measure_layer_cut`); the table
in choice.py is then only the fallback.

Cached per CPU model and flags, kernel plan, torch and tailgate version and model file (size,
mtime) under the cache directory (`TAILGATE_CACHE_DIR`, else ~/.cache/tailgate/probe/): a warm
start reads it. Its cost, Gemma 3 270M on AMD EPYC Zen 5, 2 cores: 0.22-0.29 s, 4-5 % of a warm
`tailgate serve` start (5.0-6.4 s to ready); 0 from the cache (docs/engine.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

import torch

from ...engine.cost_form import CONTEXT, SHAPES, TERMS, CostModel, features, fit, shape_features, shape_segments
from ...engine.pages import SeqPages
from ...engine.step_cost import most_within
from . import native

# The shapes timed, (decode rows, prompt rows) at CONTEXT keys, and the features each is fitted
# with, are the cost form's (`engine/cost_form.py`: SHAPES, `shape_segments`, `features`): the
# simulator seeds its step-cost model from the same ones.

# One run of each (after the warm-up step, so no first-call costs): ~0.2 s on AMD EPYC Zen 5 for
# Gemma 3 270M, where two were ~0.4 s, over the 10 % of a warm start the probe may cost. A noisy
# run shows as the fit's worst error, and live steps refine the fit from the first one.
REPS = 1
# Worst relative error of the linear fit over SHAPES above which the target is not trusted at
# start. Measured worst errors: 15 % on AMD EPYC Zen 5's `bench step` table, 16 % on Zen 3's,
# 25 % on the AMX Xeon's (where the q8 / bf16 row cut made a 64-row step cheaper than a 47-row one).
TRUST_FIT = 0.3


# A cached probe is checked at start against one quick shape (decode 8: ~17 ms on AMD EPYC Zen 5,
# the fastest of CHECK_REPS) and measured again when the two disagree: issue 42 found a cache taken
# while the test suite loaded the host (19-52x a quiet start's figures) read by every later start
# as this CPU's costs. Two bounds, as the two ways it goes wrong differ. A check slower than the
# cache may be a cold repetition (8+0 read 2.0x its warm repeat inside the suite, AMD EPYC Zen 5):
# AGREE = 3x. A check faster than the cache means the cache was measured on a busier host: the
# next session's W-std rounds started from a cache the suite had left 1.9x too slow (8+0 32.3 ms
# against 16.8 now; its fit priced a decode row at 9.45 ms), inside 3x, so AGREE_FASTER = 1.6.
# A cache that agrees there is still measured again where its own fit is over TRUST_FIT: a start
# would not trust it, and read from the cache it would stay untrusted every start after. One shape
# timed beside a neighbour's start hides from the check (AMD EPYC family 25, Llama 3.2 3B's shape:
# 8+32 read 668 ms beside 911 for 8+64 while llama.cpp's server loaded beside it, a 39 % fit; every
# later start read it, so each first wave walked at the fixed 64 rows, ~780 ms rounds under the
# live streams, ITL p99 1.8x vLLM's); the quiet re-measure costs one probe (~3 s there), once: a
# re-measured fit that is still untrusted is cached as such and read from then on.
CHECK_SHAPE = (8, 0)
CHECK_REPS = 3
AGREE = 3.0
AGREE_FASTER = 1.6
# A probe whose threads got less than this share of the cores they ran on was measured beside
# other work: it says so and is not cached. The share is the smaller of the threads' own (process
# CPU time over wall time x threads; OpenMP's worker threads spin between regions, so a quiet
# probe reads near 1) and what the rest of the machine left them (1 - other processes' share of
# every core, from /proc/stat where there is one): a neighbour on both cores can leave the
# spinning threads their CPU time and still make every step slower.
BUSY_SHARE = 0.6


# The row counts at which a plan with a row cut (`--kernels q8` beside bf16 / fp32 dense weights)
# has its layers' two kernels raced on layer 0's matrices; the cut is the largest count at which
# the quantized one won. The tables in choice.QUANT_ROWS are the fallback (a cached or failed probe
# keeps them); they disagreed with serving on the AMX Xeon (issue 35).
CUT_ROWS = (8, 16, 32, 48, 64, 96, 128)
# The live batch a tail budget is read against in the start log (`ProbeResult.budget_line`): the
# probe's own decode shape (SHAPES), so the line's "alone" is a measured row of it.
BUDGET_STREAMS = 8


@dataclass
class ProbeResult:
    rows: list[dict]  # per shape: prompt_rows, decode_rows, sampled, pairs, ms (bench step's names)
    coefficients: dict  # the fit: seconds per unit of each of cost_form.TERMS
    worst_error: float  # the fit's worst |error| / measured over the rows
    seconds: float  # what measuring took (0 when read from the cache)
    cached: bool
    layer_cut: int | None = None  # the layers' row cut measured here (None: the plan has none)
    cpu_share: float | None = None  # the measuring threads' share of their cores (None: from the cache)
    check: dict | None = None  # a cached probe's start-up check: shape, cached_ms, measured_ms, agreed

    @property
    def loaded(self) -> bool:
        """Measured while something else loaded the host (not cached)."""
        return self.cpu_share is not None and self.cpu_share < BUSY_SHARE

    @property
    def trusted(self) -> bool:
        return self.worst_error <= TRUST_FIT

    @property
    def seeds(self) -> bool:
        """Whether the engine's step-cost model starts from this fit (`seed`): trusted, and measured
        on a quiet host."""
        return self.trusted and not self.loaded

    def line(self) -> str:
        ms = {(r["decode_rows"], r["prompt_rows"]): r["ms"] for r in self.rows}
        shown = ", ".join(
            f"{name} {ms[k]:.1f} ms"
            for k, name in (
                ((1, 0), "decode 1"),
                ((8, 0), "decode 8"),
                ((8, 64), "walk 64+8"),
                ((0, 128), "prefill 128"),
            )
            if k in ms
        )
        c = self.coefficients
        how = "read from the cache" if self.cached else f"measured in {self.seconds:.2f} s"
        if self.check is not None:
            k = self.check
            how += (
                f"; the cache's {k['shape']} {k['cached_ms']:.1f} ms "
                + ("agrees with" if k["agreed"] else "disagreed with, so measured again:")
                + f" {k['measured_ms']:.1f} ms now"
            )
            if k.get("untrusted_fit") is not None:
                how += f", but its fit missed a shape by {100 * k['untrusted_fit']:.0f} %, so measured again"
        if self.loaded:
            how += (
                f"; ON A BUSY HOST (its threads got {100 * self.cpu_share:.0f} % of their cores): not cached, "
                "not used to seed the step-cost fit"
            )
        cut = "" if self.layer_cut is None else f"layers' quantized kernel for calls of <= {self.layer_cut} rows; "
        return (
            f"kernels measured here ({how}): {cut}{shown}; fit floor {1000 * c['floor']:.1f} ms + "
            f"{1000 * c['prompt_row']:.2f} ms a prompt row + {1000 * (c['decode_row'] + c['sampled_row']):.2f} ms "
            f"a decode row, worst error {100 * self.worst_error:.0f} %"
            + ("" if self.trusted else " (over the target's trust bound: rounds start as the fixed walk)")
        )

    def _round_price(self, streams: int):
        """A walk round's seconds by the fit, as a function of its prompt rows beside `streams`
        decode rows."""
        cost = CostModel(**self.coefficients)
        return lambda rows: cost.price(shape_features(streams, rows))

    def rows_within(self, target_s: float, streams: int = BUDGET_STREAMS, most: int = 4096) -> int:
        """The most prompt rows (<= `most`) a walk round beside `streams` decode rows holds within
        `target_s` by the fit; 0 when not even one does. One row mid-prompt counts as a decode row
        (as the engine counts it: `step_features`), so a row can price above two where a decode row
        costs more than two prompt rows (AMD EPYC Zen 3's costs); from two rows on the price grows."""
        price = self._round_price(streams)
        if most < 2 or price(2) > target_s:
            return min(1 if price(1) <= target_s else 0, most)
        return most_within(price, target_s, 2, most)

    def budget_line(self, target_ms: int, streams: int = BUDGET_STREAMS, most: int = 4096) -> str:
        """What a tail budget (ITL_TARGET_MS=N ms) holds on this CPU by the fit, for the start log:
        a user choosing N sees at once whether it leaves room for prompts beside a live batch.
        `most`: the most rows worth saying (the context)."""
        rows = self.rows_within(target_ms / 1000, streams, most)
        alone = 1000 * self._round_price(streams)(0)
        live = f"{streams} live stream" + ("s" if streams != 1 else "")
        if rows:
            count = f"at least {rows}" if rows >= most else str(rows)
            held = (
                f"a round beside {live} holds {count} prompt row{'s' if rows != 1 else ''} within it "
                f"({live} alone: {alone:.1f} ms)"
            )
        else:
            held = f"{live} alone take {alone:.1f} ms, leaving no room: rounds beside them carry one prompt row"
        unused = (
            " (this fit is not used: rounds start as the fixed walk and the budget prices them once live steps "
            "have taught it)"
            if not self.seeds
            else ""
        )
        return (
            f"tail budget {target_ms} ms (ITL_TARGET_MS): by the fit above{unused}, {held}; when the requests "
            "in need more prompt rows a step they wait in the queue instead (first tokens later; "
            "--ttft-target-ms N widens rounds to bound that wait)"
        )

    def as_dict(self) -> dict:
        return {
            "rows": self.rows,
            "fit": self.coefficients,
            "worst_error": self.worst_error,
            "seconds": self.seconds,
            "cached": self.cached,
            "layer_cut": self.layer_cut,
            "cpu_share": self.cpu_share,
            "loaded": self.loaded,
            "check": self.check,
        }


@torch.inference_mode()
def measure(runner, book, shapes=SHAPES, reps: int = REPS, clock=time.perf_counter) -> list[dict] | None:
    """Each shape's fastest of `reps` runs, through scratch pages returned before this returns;
    None when the pools cannot hold the shapes (a tiny KV budget)."""
    need = [CONTEXT + 1] * max(d for d, _ in shapes) + [2 * max(p for _, p in shapes)]
    seqs = [SeqPages() for _ in need]
    try:
        for s, n in zip(seqs, need):
            if not book.reserve(s, n):
                return None
        # (the decode rows' context is not prefilled: attention reads CONTEXT keys of whatever the
        # pages hold, at the same cost, and prefilling 8 x 128 rows cost 0.6 s on AMD EPYC Zen 5)
        rows = []
        for decode, prompt in shapes:
            segs = shape_segments(decode, prompt, seqs)
            best = float("inf")
            for _ in range(reps):
                t0 = clock()
                runner.step(segs)
                best = min(best, clock() - t0)
            rows.append(
                {"kind": f"{decode}+{prompt}", "n": prompt or decode, "ms": 1000 * best, **features(decode, prompt)}
            )
        return rows
    finally:
        for s in seqs:
            book.free(s)


def _cut_mats(w: dict) -> list | None:
    """Layer 0's q8 matrices that also hold a dense form (a plan with a row cut), else None."""
    from .choice import EVERY, Linear

    mats = [v for k, v in w.items() if k.startswith("layers.0.") and isinstance(v, Linear)]
    ok = mats and all(m.quant == "q8" and m.w is not None and 0 < m.max_q_rows < EVERY for m in mats)
    return mats if ok else None


@torch.inference_mode()
def measure_layer_cut(w: dict, rows=CUT_ROWS, reps: int = 3, clock=time.perf_counter) -> int | None:
    """The largest of `rows` at which q8 took no longer than the dense kernel over layer 0's
    matrices (fastest of `reps` each; 0 when dense always won); None when the plan has no cut."""
    from . import native

    mats = _cut_mats(w)
    if mats is None:
        return None
    g = torch.Generator().manual_seed(0)
    cut = 0
    for m in rows:
        xs = [torch.randn(m, lin.q[0].shape[1], generator=g) for lin in mats]
        best = []
        for run in (
            lambda lin, x: native.q8_linear(x, *lin.q),
            lambda lin, x: lin._dense(x.to(lin.dense_dtype or x.dtype)),
        ):
            t = float("inf")
            for _ in range(reps):
                t0 = clock()
                for lin, x in zip(mats, xs):
                    run(lin, x)
                t = min(t, clock() - t0)
            best.append(t)
        if best[0] <= best[1]:
            cut = m
    return cut


def apply_layer_cut(w: dict, cut: int) -> None:
    """Every layer matrix's row cut (the head keeps the table's: its calls rarely pass ~32 rows)."""
    for k, v in w.items():
        if k.startswith("layers.") and getattr(v, "quant", None) == "q8" and getattr(v, "w", None) is not None:
            v.max_q_rows = cut


def weight_forms(w: dict) -> str:
    """The panel forms the weights are held in, counted by code ("2x36 7x90 9x17"): which form a
    matrix takes can change with no change to the plan's line or the kernels' sources (a layer's
    Q6_K went from int8 panels to 6 bits on AVX-512 VNNI, ~10 % off a 1B decode step), and the
    probe then times different steps."""
    codes: dict[int, int] = {}
    for v in w.values():
        panels = getattr(v, "wide", None)
        if panels is None:
            continue
        for code in [panels[-1]] if isinstance(panels[-1], int) else [seg[-1] for seg in panels]:
            codes[code] = codes.get(code, 0) + 1
    return " ".join(f"{c}x{n}" for c, n in sorted(codes.items()))


def cache_key(plan, source, forms: str = "") -> str:
    from ... import __version__
    from .cpu import this_cpu

    cpu = this_cpu()
    try:
        st = source.stat()
        ident = f"{source.resolve()}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        ident = str(source)
    raw = "|".join(
        [
            cpu.model,
            " ".join(sorted(cpu.flags)),
            plan.line(),
            torch.__version__,
            __version__,
            ident,
            repr(SHAPES),
            str(CONTEXT),
            str(torch.get_num_threads()),
            native.build_name(),  # a kernel change under the same version: timed again (a 4-bit
            # panel build read the int8 build's probe, decode 1 153 ms for a ~111 ms step, 3B)
        ]
        + ([forms] if forms else [])
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def machine_busy_s() -> tuple[float, int] | None:
    """(CPU seconds every process has used, the machine's CPU count) from /proc/stat; None where
    there is none."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = [int(x) for x in lines[0].split()[1:]]
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
    cpus = sum(1 for x in lines if x.startswith("cpu") and x[3:4].isdigit())
    return busy / os.sysconf("SC_CLK_TCK"), max(1, cpus)


def busy_share(fn):
    """(fn(), the share of its cores it got: its threads' CPU time over wall x threads, or less
    where other processes took part of the machine meanwhile; BUSY_SHARE's comment)."""
    m0, w0, c0 = machine_busy_s(), time.perf_counter(), time.process_time()
    out = fn()
    wall, own = time.perf_counter() - w0, time.process_time() - c0
    share = own / max(1e-9, wall * torch.get_num_threads())
    m1 = machine_busy_s()
    if m0 is not None and m1 is not None:
        others = max(0.0, (m1[0] - m0[0]) - own) / max(1e-9, wall * m1[1])
        share = min(share, 1.0 - others)
    return out, share


def check_cached(runner, book, rows: list[dict], clock=time.perf_counter) -> dict | None:
    """Time CHECK_SHAPE now against the cached row for it; None when the cache has no such row."""
    want = f"{CHECK_SHAPE[0]}+{CHECK_SHAPE[1]}"
    old = next((r["ms"] for r in rows if r.get("kind") == want), None)
    if old is None:
        return None
    now = measure(runner, book, shapes=(CHECK_SHAPE,), reps=CHECK_REPS, clock=clock)
    if now is None:
        return None
    ms = now[0]["ms"]
    return {"shape": want, "cached_ms": old, "measured_ms": ms, "agreed": 1 / AGREE_FASTER <= ms / old <= AGREE}


def run(runner, book, source, cache_dir=None, log=None, clock=time.perf_counter) -> ProbeResult | None:
    """The probe's result for this machine, plan and model: from the cache when one quick shape
    measured now agrees with it, else measured (and cached unless the host was busy). None where
    the pools cannot hold the shapes. `clock` times the steps (a test's own clock makes the
    cache's agreement check deterministic)."""
    from ..formats.weights import cache_root

    path = (cache_dir or cache_root()) / "probe" / f"{cache_key(runner.plan, source, weight_forms(runner.w))}.json"
    rows, took, cached, cut, share, check, fitted = None, 0.0, False, None, None, None, None
    try:
        saved = json.loads(path.read_text())
        rows, cut, cached = saved["rows"], saved.get("layer_cut"), True
        if cut is not None and _cut_mats(runner.w) is not None:
            apply_layer_cut(runner.w, cut)
        check = check_cached(runner, book, rows, clock)
        if check is not None and not check["agreed"]:
            rows, cached = None, False  # measured again below; the stale file is replaced
        elif check is not None and not saved.get("retried") and (fitted := _fit(rows))[1] > TRUST_FIT:
            check["untrusted_fit"] = fitted[1]
            rows, cached, fitted = None, False, None
    except (OSError, ValueError, KeyError):
        pass
    if rows is None:
        t0 = time.perf_counter()
        if check is None:  # a stale cache keeps its cut: the cut races kernels, not whole steps
            cut = measure_layer_cut(runner.w)
            if cut is not None:  # before the steps: their costs follow the cut
                apply_layer_cut(runner.w, cut)
        rows, share = busy_share(lambda: measure(runner, book, clock=clock))
        took = time.perf_counter() - t0
        if rows is None:
            return None
    coefficients, worst = fitted or _fit(rows)  # the cached rows' fit is the one checked above
    result = ProbeResult(rows, coefficients, worst, took, cached, cut, share, check)
    if not cached:
        _keep(path, result)
    if log is not None:
        log(result.line())
    return result


def _fit(rows: list[dict]) -> tuple[dict, float]:
    """The cost form's fit over the probe's rows: its coefficients per term and its worst relative
    error."""
    model, errors = fit(rows, None, "start-up probe")
    return {t: getattr(model, t) for t in TERMS}, max(abs(e["error_pct"]) for e in errors) / 100


def _keep(path, result: ProbeResult) -> None:
    """Cache a fresh probe, unless it was measured on a busy host (then drop any stale file)."""
    if result.loaded:
        path.unlink(missing_ok=True)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        # `retried`: measured again for an untrusted fit and still untrusted; read as it is next
        # time, not measured again at every start where a quiet fit is no better
        retried = bool(result.check and result.check.get("untrusted_fit") is not None) and not result.trusted
        tmp.write_text(json.dumps({"rows": result.rows, "layer_cut": result.layer_cut, "retried": retried}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: measured again next start


def seed(model, result: ProbeResult) -> None:
    """Teach the engine's step-cost model the probe's steps (`step_cost.StepCostModel.observe`),
    as if they had been its first steps: it is `ready` at once and forgets them as live steps come."""
    if not result.seeds:
        return
    for r in result.rows:
        model.observe((r["prompt_rows"], r["decode_rows"], r["sampled"], r["pairs"] / 1000), r["ms"] / 1000)
