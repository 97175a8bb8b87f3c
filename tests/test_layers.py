"""The simulator and the model stay apart (issue 43 item 2): nothing under tailgate/sim imports
tailgate.model and nothing under tailgate/model imports tailgate.sim, at module level or inside a
function. What both need (the cost form, the probe's shapes) lives in tailgate/engine
(`engine/cost_form.py`); what needs the model to fit the simulator's preset lives in tailgate/bench
(`bench/calibrate.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "tailgate"
APART = {"sim": "model", "model": "sim"}


def module_name(path: Path, root: Path = PKG.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = PKG.parent) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import anywhere in the file: `from X import y` names
    both X and X.y (y may be a submodule), relative imports resolved against the file's package."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


def crossings(layer: str, pkg: Path = PKG) -> list[str]:
    other = f"tailgate.{APART[layer]}"
    found: dict[str, str] = {}  # one per import statement: its first name that crosses
    for path in sorted((pkg / layer).rglob("*.py")):
        for line, name in imported(path, pkg.parent):
            if name == other or name.startswith(other + "."):
                found.setdefault(f"{path.relative_to(pkg.parent)}:{line}", name)
    return [f"{where}: {name}" for where, name in found.items()]


@pytest.mark.parametrize("layer", sorted(APART))
def test_sim_and_model_never_import_each_other(layer):
    bad = crossings(layer)
    assert not bad, f"tailgate/{layer} imports tailgate.{APART[layer]}:\n" + "\n".join(bad)


def test_the_check_sees_relative_absolute_and_function_level_imports(tmp_path):
    """What the probe imported before this issue (`from ...sim.cost import fit` inside a function)
    and the other spellings of an import of the simulator are each caught; a sibling's is not."""
    fake = tmp_path / "tailgate" / "model" / "kernels"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text(
        "from .. import formats\n"
        "def f():\n    from ...sim.cost import fit\n    from ... import sim\n    import tailgate.sim.run\n"
        "    from ...engine.cost_form import fit\n"
    )
    got = {line.split(":")[1] for line in crossings("model", tmp_path / "tailgate")}
    assert got == {"3", "4", "5"}
    assert "tailgate.engine.cost_form" in [m for _, m in imported(PKG / "model" / "kernels" / "probe.py")]


def test_sim_calibrate_still_runs_the_calibration_now_in_bench(monkeypatch):
    """`tailgate sim calibrate` (its flags are the simulator's) reaches `bench/calibrate.py` through
    the CLI; a plain `tailgate sim` does not."""
    from tailgate import cli
    from tailgate.bench import calibrate

    seen = []
    monkeypatch.setattr(calibrate, "calibrate", lambda args: seen.append(args.calibrate_model) or 0)
    assert cli.main(["sim", "calibrate", "--calibrate-model", "smollm2-135m"]) == 0
    assert seen == ["smollm2-135m"]
    assert cli.main(["sim", "--num-prompts", "2", "--max-concurrency", "1"]) == 0 and len(seen) == 1
