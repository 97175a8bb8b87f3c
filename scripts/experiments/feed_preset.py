"""A simulator cost preset fitted from served step traces (`socket_tail_arm.sh` with TRACE=1 keeps
NAME.feed, the server's `/dashboard/feed`): the same least squares `tailgate sim calibrate` runs
over `tailgate bench step`'s table (engine/cost_form.py `fit`), over every step the server ran
instead. Why: at Llama 3.2 3B's shape on AMD EPYC Zen 3 the bench table's fit priced a decode step
of one row at 63 ms where the served ones took ~147 ms (its worst error, 56 %, was that step), so
the simulator saw a round's floor at a quarter of what a served round pays; fitted from four served
arms the floor is ~0.13 s and the simulator's default-vs-walk figures land within a few % of the
real pairs'. The trace carries no contexts, so the query-key pairs are W-std's on average
(replay_step_trace.py `features`).

`--schedules` prints, per trace, its steps' seconds and the same steps priced at the fit over all
the traces: two arms' schedules compared at one set of prices, the host's drift between them (the
last column, measured over priced) taken out. On these VMs the host's pace moved 8 % between two
arms minutes apart, more than the 3 % a default-vs-walk bound asks to see.

    .venv/bin/python scripts/experiments/feed_preset.py [--save NAME] [--kv-from PRESET] [--schedules] DIR/*.feed
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from replay_step_trace import features, steps  # this directory, as the script's

from tailgate.engine.cost_form import fit
from tailgate.sim.cost import load_preset, save_preset


def rows(paths: list[str]) -> list[dict]:
    out = []
    for path in paths:
        for s in steps(path):
            p, d, sampled, kpairs = features(s)
            out.append(
                dict(
                    kind=s["kind"],
                    n=p + d,
                    prompt_rows=p,
                    decode_rows=d,
                    sampled=sampled,
                    pairs=1000 * kpairs,
                    ms=1000 * s["duration_s"],
                    trace=path,
                )
            )
    return out


def schedules(table: list[dict], model) -> None:
    """Each trace's steps: how many, their measured seconds, and the same steps at `model`'s prices."""
    per = {}  # trace -> [steps, measured s, priced s], in the traces' order
    for r in table:
        t = per.setdefault(r["trace"], [0, 0.0, 0.0])
        t[0] += 1
        t[1] += r["ms"] / 1000
        t[2] += model.price((r["prompt_rows"], r["decode_rows"], r["sampled"], r["pairs"] / 1000))
    for path, (n, took, priced) in per.items():
        print(f"{path}: {n} steps took {took:.1f} s; at the fit's prices {priced:.1f} s; host pace {took / priced:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", metavar="NAME", help="write it to tailgate/sim/presets.json under NAME")
    ap.add_argument("--kv-from", metavar="PRESET", help="take kv_token_bytes and window from this preset")
    ap.add_argument("--note", default="", help="appended to the preset's source (the CPU, the arms)")
    ap.add_argument("--schedules", action="store_true", help="each trace's steps at the fit's prices too")
    ap.add_argument("feeds", nargs="+")
    a = ap.parse_args()
    table = rows(a.feeds)
    source = f"scripts/experiments/feed_preset.py: least squares over {len(table)} served steps ({len(a.feeds)} traces)"
    model, errors = fit(table, None, source, mixed=True)
    errs = sorted(abs(e["error_pct"]) for e in errors)
    model = replace(
        model,
        source=f"{source}; error p50 {errs[len(errs) // 2]:.0f} %, p90 {errs[int(0.9 * len(errs))]:.0f} %"
        + (f"; {a.note}" if a.note else ""),
    )
    if a.kv_from:
        base = load_preset(a.kv_from)
        model = replace(model, kv_token_bytes=base.kv_token_bytes, window=base.window)
    print(json.dumps(asdict(model), indent=1))
    if a.save:
        save_preset(a.save, model)
    if a.schedules:
        schedules(table, model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
