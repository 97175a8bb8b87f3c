"""The tables of docs/benchmarks/socket-tail.md from the rounds' logs (socket_tail_rounds.sh,
socket_tail_open.sh): per arm and shape the client's figures (vLLM's `bench serve`) beside the
server's own view, each round's value and the arms' ratios of the mean.

    .venv/bin/python scripts/experiments/socket_tail_table.py OUT/all.log [OUT/open.log]
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict

CLIENT = {
    "Output token throughput (tok/s)": "tok/s",
    "Median TTFT (ms)": "TTFT p50",
    "P99 TTFT (ms)": "TTFT p99",
    "Median ITL (ms)": "ITL p50",
    "P99 ITL (ms)": "ITL p99",
}


# (arm, against): until issue 42 the default was `auto` and the walk an arm ("walk"); then the
# default was the walk and `auto` the arm ("auto"); since the walk widens under a backlog by
# default, the fixed 64-row walk is the arm ("walk") again.
PAIRS = (
    ("default", "walk"),
    ("auto", "default"),
    ("default", "vllm"),
    ("walk", "vllm"),
    ("auto", "vllm"),
    ("default", "before"),  # a change against the code before it (a worktree)
    ("before", "walk"),
    ("late6", "default"),  # a LATE of 6 horizons against the default 4 (a worktree)
    ("new", "before"),  # a change against the code before it, both worktrees
    ("new", "vllm"),
    ("new", "llama"),  # issue 45 at 3B: the priced walk beside both peers
    ("new", "fixed"),  # a change against the fixed walk (--mix-chunk-tokens 64)
    ("before", "fixed"),
    ("even", "default"),  # ITL_TARGET_MS=auto with evened rounds against the default walk
    ("even", "vllm"),
    ("tailgate", "llama"),  # issue 45: sizes_rounds.sh and the 1B open-loop runs
    ("tailgate", "vllm"),
    ("tail", "default"),  # issue 45: a tail budget (--itl-target-ms T) at 1B / 3B; sizes_rounds.sh
    ("tail", "tailgate"),  # with TAIL_MS names the default arm `tailgate` (the first runs: `default`)
    ("tail", "vllm"),
    ("tail", "llama"),
    ("default", "llama"),
)


def read(paths) -> dict:
    """{(arm, shape): {figure: [value per round]}}"""
    cells = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for line in open(path):
            name, _, rest = line.strip().partition(" ")
            m = re.match(r"r(\d+)-(\w+)-(\w+)$", name)
            if not m:
                continue
            key = (m.group(2), m.group(3))
            for label, fig in CLIENT.items():
                if rest.startswith(label + ":"):
                    cells[key][fig].append(float(rest.split()[-1]))
            if ready := re.match(r"ready ([\d.]+) s, peak RSS (\d+) MiB", rest):
                cells[key]["ready s"].append(float(ready.group(1)))
                cells[key]["peak RSS MiB"].append(float(ready.group(2)))
            if bw := re.match(r"host read bandwidth ([\d.]+) GiB/s", rest):
                cells[key]["host GiB/s"].append(float(bw.group(1)))
            if rest.startswith("server-view"):
                for what, p99 in re.findall(r"(\w+): p50 [\d.]+ p99 ([\d.]+)", rest):
                    cells[key][f"server {what} p99"].append(float(p99))
    return cells


def main(paths) -> None:
    cells = read(paths)
    figs = list(CLIENT.values()) + ["server itl p99", "server socket_itl p99", "server delivery p99"]
    figs += [f for f in ("ready s", "peak RSS MiB", "host GiB/s") if any(f in v for v in cells.values())]
    print("| arm | shape | " + " | ".join(figs) + " |")
    print("|---|---|" + "---|" * len(figs))
    for (arm, shape), v in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row = [" / ".join(f"{x:.1f}" if x < 100 else f"{x:.0f}" for x in v.get(f, [])) or "-" for f in figs]
        print(f"| {arm} | {shape} | " + " | ".join(row) + " |")
    print()
    print("ratios of the round means (client figures), for each pair of arms the logs hold")
    for shape in sorted({s for _, s in cells}):
        for arm, other in PAIRS:
            d, o = cells.get((arm, shape)), cells.get((other, shape))
            if d and o:
                r = {f: statistics.mean(d[f]) / statistics.mean(o[f]) for f in CLIENT.values() if d[f] and o[f]}
                print(f"{shape} {arm}/{other}: " + ", ".join(f"{f} {x:.2f}x" for f, x in r.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
