"""`tailgate bench plot`: ITL CDF (log x), TTFT CDF and a token timeline from detailed results."""
from __future__ import annotations

import json
import os


def main(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for path in args.results:
        with open(path) as f:
            d = json.load(f)
        if "itls" not in d:
            raise SystemExit(f"{path}: no per-request arrays; run `bench serve --save-result X --save-detailed`")
        runs.append((os.path.splitext(os.path.basename(path))[0], d))
    os.makedirs(args.out_dir, exist_ok=True)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, d in runs:
        itl = sorted(1e3 * x for xs in d["itls"] for x in xs)
        ttft = sorted(1e3 * x for x in d["ttfts"] if x is not None)
        a1.plot(itl, [i / len(itl) for i in range(len(itl))], label=name)
        a2.plot(ttft, [i / len(ttft) for i in range(len(ttft))], label=name)
    a1.set_xscale("log")
    a1.set_xlabel("inter-token latency (ms, log)")
    a2.set_xlabel("time to first token (ms)")
    for a in (a1, a2):
        a.set_ylabel("fraction")
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "cdf.png"), dpi=110)
    for name, d in runs:
        fig, ax = plt.subplots(figsize=(11, 5))
        t0 = min(d["start_times"])
        for i, (start, times) in enumerate(zip(d["start_times"], d["token_times"])):
            ax.plot([t - t0 for t in times], [i] * len(times), "|", ms=3, color="tab:blue")
            ax.plot([start - t0], [i], ">", ms=3, color="tab:red")  # sent
            if times:
                ax.plot([times[0] - t0], [i], "o", ms=3, color="tab:green")  # first token
        ax.set_xlabel("seconds since the first request (red: sent, green: first token, ticks: tokens)")
        ax.set_ylabel("request")
        ax.set_title(f"token timeline: {name}")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out_dir, f"timeline-{name}.png"), dpi=110)
    print(f"wrote {args.out_dir}/cdf.png and {len(runs)} timeline(s)")
    return 0


def add_args(p) -> None:
    p.add_argument("results", nargs="+")
    p.add_argument("--out-dir", default="results/plots")
