"""The simulator's step-cost presets: `presets.json`, each a `CostModel` with the source of every
number; `local` is fitted from `tailgate bench step` on the machine that ran `tailgate sim calibrate`
(`bench/calibrate.py`).

The cost form itself (TERMS, `CostModel`, the least-squares `fit`) is the engine's
(`engine/cost_form.py`), shared with the engine's step-cost fit and the start-up probe; it is
named here too for the simulator's importers.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..engine.cost_form import TERMS, CostModel, fit  # noqa: F401  (the simulator's names for them)

PRESETS = Path(__file__).with_name("presets.json")


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


def save_preset(name: str, model: CostModel, path: Path = PRESETS) -> None:
    table = json.loads(path.read_text()) if path.exists() else {}
    table[name] = asdict(model)
    path.write_text(json.dumps(table, indent=1) + "\n")
