"""The step's cost form: one list of terms, one rule counting a step's features, one fit.

TL;DR: a step costs `floor + prompt_row * prompt rows + decode_row * decode rows + sampled_row *
sampled rows + attn_per_1k * (query-key pairs / 1000)`; the engine's online fit
(`step_cost.StepCostModel`), the start-up probe (`model/kernels/probe.py`) and the simulator
(`sim/cost.py`'s presets, `sim/engine.py`) all read TERMS, `step_features`, `CostModel`, `fit` and
the probe's SHAPES from here, so neither `model` nor `sim` imports the other.

A prompt row is a row of a multi-token segment (a prefill or a walk chunk); a decode row is a
one-token segment; sampled rows go through the LM head; query-key pairs price attention by
context. Plain data: numpy only inside `fit` (the engine never calls it), no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pages import SeqPages
from .plan import Segment

TERMS = ("floor", "prompt_row", "decode_row", "sampled_row", "attn_per_1k")

# The start-up probe's shapes, (decode rows, prompt rows): decode rows each read CONTEXT keys;
# prompt rows sit half-way into a prompt of twice their length (a walk round), or at position 0
# when no decode rows ride (a prefill). What a real engine's step-cost model has seen before its
# first request, and what the simulator seeds its own with (`sim/engine.py` `seed_costs`).
SHAPES = ((1, 0), (8, 0), (8, 32), (8, 64), (0, 128))
CONTEXT = 128


def step_features(segments) -> tuple[int, int, int, float]:
    """(prompt rows, decode rows, sampled rows, query-key pairs / 1000) of a step's segments: a row
    of a multi-token segment (or of a segment at position 0) is a prompt row, a one-token segment is
    a decode row. The one rule: the engine's fit, the simulator's `CostModel` and the probe count with it."""
    prompt = decode = sampled = pairs = 0
    for s in segments:
        n, st = len(s.tokens), s.start
        if n > 1 or st == 0:
            prompt += n
        else:
            decode += 1
        if s.sample:
            sampled += 1
        pairs += n * st + n * (n + 1) // 2
    return prompt, decode, sampled, pairs / 1000


@dataclass(frozen=True)
class CostModel:
    floor: float  # seconds per step
    prompt_row: float  # seconds per prompt row
    decode_row: float  # seconds per decode row
    sampled_row: float = 0.0  # seconds per sampled row (the LM head)
    attn_per_1k: float = 0.0  # seconds per 1000 query-key pairs
    window: int | None = None  # the model's sliding window (None: every layer global)
    # K+V bytes one token takes in each pool ({"global": ..., "local": ...}, as
    # `model.runtime.kv_cache.token_bytes`): what `KV_CACHE_MB` budgets are sized with. None: no budget.
    kv_token_bytes: dict | None = None
    source: str = ""
    # Seconds more a step with prompt rows pays than its terms say (the engine's fit holds the same
    # term, step_cost.MIXED_FLOOR). `bench step`'s table cannot tell it from the floor and leaves it
    # 0; a fit of served steps can (scripts/experiments/feed_preset.py: Llama 3.2 3B on AMD EPYC
    # Zen 3, 25 ms beside a 117 ms floor), and without it an extra round looked as cheap as a
    # decode-only step to the simulator, which then put a narrowing rule's throughput cost at half
    # the real pairs'.
    mixed_floor: float = 0.0

    def features(self, segments) -> tuple[int, int, int, float]:
        """The step's (prompt rows, decode rows, sampled rows, query-key pairs / 1000), counted by
        the one rule the engine's step-cost fit counts them with (`step_features`)."""
        return step_features(segments)

    def price(self, features) -> float:
        """Seconds of a step with these features (`step_features`'s order)."""
        p, d, s, k = features
        return (
            self.floor
            + (self.mixed_floor if p else 0.0)
            + self.prompt_row * p
            + self.decode_row * d
            + self.sampled_row * s
            + self.attn_per_1k * k
        )

    def step_seconds(self, segments) -> float:
        return self.price(step_features(segments))


def shape_segments(decode: int, prompt: int, seqs: list) -> list[Segment]:
    """The segments of a probe shape over `seqs` (decode rows first, the prompt's sequence last)."""
    segs = [Segment([1], CONTEXT, s) for s in seqs[:decode]]
    if prompt:  # a walk round mid-prompt samples nothing; a whole prefill samples its last row
        segs.append(Segment([1] * prompt, prompt if decode else 0, seqs[-1], sample=not decode))
    return segs


def shape_features(decode: int, prompt: int) -> tuple[int, int, int, float]:
    """A probe shape's `step_features`, over the segments the probe runs for it."""
    return step_features(shape_segments(decode, prompt, [SeqPages() for _ in range(max(decode, 1))]))


def features(decode: int, prompt: int) -> dict:
    """A probe shape's features under bench step's names (what `fit` reads)."""
    p, d, s, k = shape_features(decode, prompt)
    return dict(prompt_rows=p, decode_rows=d, sampled=s, pairs=round(k * 1000))


def fit(rows: list[dict], window: int | None, source: str, mixed: bool = False) -> tuple[CostModel, list[dict]]:
    """Least squares (non-negative terms) over `bench step` rows, each with prompt_rows,
    decode_rows, sampled, pairs and ms. Returns the model and each row's fit error. `mixed`: fit
    `mixed_floor` too (served steps, whose prompt rows come in many widths beside decode rows)."""
    import numpy as np  # here only: the engine's own fit (step_cost.py) is plain Python

    X = np.array(
        [
            [1.0, r["prompt_rows"], r["decode_rows"], r["sampled"], r["pairs"] / 1000]
            + ([1.0 if r["prompt_rows"] else 0.0] if mixed else [])
            for r in rows
        ]
    )
    y = np.array([r["ms"] / 1000 for r in rows])
    keep = list(range(X.shape[1]))
    while True:  # a term the data price negative (collinear with another here) is dropped; refit
        coef, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(X.shape[1])
    full[keep] = np.maximum(coef, 0)
    model = CostModel(*map(float, full[:5]), window=window, source=source, mixed_floor=float(full[5]) if mixed else 0.0)
    errors = [
        {
            "kind": r["kind"],
            "n": r["n"],
            "ms": r["ms"],
            "fit_ms": 1000 * float(X[i] @ full),
            "error_pct": 100 * (float(X[i] @ full) - y[i]) / y[i],
        }
        for i, r in enumerate(rows)
    ]
    return model, errors
