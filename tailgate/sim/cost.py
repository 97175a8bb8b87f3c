"""Step-cost models: how long one scheduler step takes, from what the step holds.

    seconds = floor + prompt_row * prompt rows + decode_row * decode rows
              + sampled_row * sampled rows + attn_per_1k * (query-key pairs / 1000)

A prompt row is a row of a multi-token segment (a prefill or a walk chunk); a decode row is a
one-token segment; sampled rows go through the LM head; query-key pairs price attention by
context. Presets live in `presets.json` with the source of every number; `local` is fitted from
`tailgate bench step` on the machine that ran `tailgate sim calibrate`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..engine.step_cost import step_features

PRESETS = Path(__file__).with_name("presets.json")
TERMS = ("floor", "prompt_row", "decode_row", "sampled_row", "attn_per_1k")


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

    def features(self, segments) -> tuple[float, float, float, float]:
        """The step's (prompt rows, decode rows, sampled rows, query-key pairs / 1000), counted by
        the one rule the engine's step-cost fit counts them with (`engine.step_cost.step_features`)."""
        return step_features(segments)

    def step_seconds(self, segments) -> float:
        p, d, s, k = self.features(segments)
        return self.floor + self.prompt_row * p + self.decode_row * d + self.sampled_row * s + self.attn_per_1k * k


def load_preset(name: str, path: Path = PRESETS) -> CostModel:
    table = json.loads(path.read_text())
    if name not in table:
        raise ValueError(f"unknown cost preset {name!r} (presets: {', '.join(sorted(table))}; or a JSON file path)")
    return CostModel(**table[name])


def resolve_cost(name_or_path: str) -> CostModel:
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        return CostModel(**json.loads(p.read_text()))
    return load_preset(name_or_path)


def fit(rows: list[dict], window: int | None, source: str) -> tuple[CostModel, list[dict]]:
    """Least squares (non-negative terms) over `bench step` rows, each with prompt_rows,
    decode_rows, sampled, pairs and ms. Returns the model and each row's fit error."""
    X = np.array([[1.0, r["prompt_rows"], r["decode_rows"], r["sampled"], r["pairs"] / 1000] for r in rows])
    y = np.array([r["ms"] / 1000 for r in rows])
    keep = list(range(X.shape[1]))
    while True:  # a term the data price negative (collinear with another here) is dropped; refit
        coef, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(X.shape[1])
    full[keep] = np.maximum(coef, 0)
    model = CostModel(*map(float, full), window=window, source=source)
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


def save_preset(name: str, model: CostModel, path: Path = PRESETS) -> None:
    table = json.loads(path.read_text()) if path.exists() else {}
    table[name] = asdict(model)
    path.write_text(json.dumps(table, indent=1) + "\n")
