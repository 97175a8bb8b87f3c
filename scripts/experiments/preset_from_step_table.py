"""A simulator cost preset from a `tailgate bench step` table measured on another machine.

`tailgate sim calibrate` fits the `local` preset by running `bench step` here. For a CPU class
this session cannot land on, the table another session printed there (e.g.
`../shared/design/measured/zen5-bench-step.txt`) is the best evidence: this reads its "chosen"
section, rebuilds each row's features exactly as `bench step` defines them (decode B rows at 256
keys of context; a walk round of 64 prompt rows half-way into a 256-token prompt riding B decode
rows; a whole prefill of N rows), fits the same least squares as `calibrate` and saves the preset
under NAME, so `tailgate sim --cost NAME` prices that machine.

    .venv/bin/python scripts/experiments/preset_from_step_table.py \
        ../shared/design/measured/zen5-bench-step.txt zen5-measured

Its figures are that table's: a plan or host change since then is not in them (the preset's
`source` says which table and what it lacks).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from tailgate.sim.cost import fit, load_preset, save_preset

CONTEXT = 256  # `bench step`'s default context (keys each decode row reads)
CHUNK = 64  # its walk round's prompt rows
ROW = re.compile(r"^(decode|mixed\+(\d+)|prefill)\s+(\d+)\s+([\d.]+) ms")


def rows_from(text: str) -> list[dict]:
    """The chosen plan's rows with their features (`bench step`'s `report` arguments)."""
    section = text.split("== chosen", 1)[1].split("== alternative", 1)[0]
    rows = []
    for line in section.splitlines():
        m = ROW.match(line.strip())
        if not m:
            continue
        kind, riders, n, ms = m.group(1), m.group(2), int(m.group(3)), float(m.group(4))
        if kind == "decode":
            feats = dict(prompt_rows=0, decode_rows=n, sampled=n, pairs=n * (CONTEXT + 1))
        elif riders is not None:
            b, k0 = int(riders), CONTEXT // 2
            feats = dict(prompt_rows=n, decode_rows=b, sampled=b, pairs=n * k0 + n * (n + 1) // 2 + b * (CONTEXT + 1))
        else:
            feats = dict(prompt_rows=n, decode_rows=0, sampled=1, pairs=n * (n + 1) // 2)
        rows.append({"kind": kind.split("+")[0] if riders is None else kind, "n": n, "ms": ms, **feats})
    if not rows:
        raise SystemExit("no '== chosen' rows found (expected `tailgate bench step` output)")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", help="a file holding `tailgate bench step` output")
    p.add_argument("name", help="the preset name to save (tailgate/sim/presets.json)")
    a = p.parse_args()
    text = open(a.table).read()
    rows = rows_from(text)
    local = load_preset("local")  # the same model: its window and KV bytes per token
    model, errors = fit(rows, local.window, "")
    # the table's own comment line when it has one (machine, commit), else its CPU line
    head = next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("# ")), None) or next(
        (ln.strip() for ln in text.splitlines() if ln.startswith("CPU:")), ""
    )
    worst = max(abs(e["error_pct"]) for e in errors)
    source = (
        f"scripts/experiments/preset_from_step_table.py over {a.table.rsplit('/', 1)[-1]} ({head}); "
        f"{len(rows)} rows at {CONTEXT} keys only (attention's price is not seen apart from the rows'); "
        f"worst fit error {worst:.0f} %"
    )
    model = replace(model, source=source, kv_token_bytes=local.kv_token_bytes)
    for e in errors:
        print(
            f"{e['kind']:9s} {e['n']:5d}  measured {e['ms']:8.1f} ms  fit {e['fit_ms']:8.1f} ms  {e['error_pct']:+6.1f} %"
        )
    save_preset(a.name, model)
    print(f"{a.name}: {model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
