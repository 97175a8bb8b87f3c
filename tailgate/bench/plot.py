"""`tailgate bench plot`: ITL CDF (log x), TTFT CDF and a token timeline from detailed results."""

from __future__ import annotations

import json
import os


# Tick colours for tailgate's stall attribution (decode-only steps stay the plain blue).
CAUSE_COLORS = {
    "decode": "tab:blue",
    "mixed": "tab:orange",
    "walk": "tab:purple",
    "prefill": "tab:gray",
    "recompute": "tab:brown",
}


def main(args) -> int:
    try:
        import matplotlib
    except ImportError:
        print("tailgate bench plot: needs matplotlib, the `plots` extra: pip install 'tailgate[plots]'")
        return 2

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
        causes = d.get("token_causes") or [[None] * len(t) for t in d["token_times"]]
        seen = set()
        for i, (start, times, why) in enumerate(zip(d["start_times"], d["token_times"], causes)):
            for cause in sorted(set(why), key=str):  # ticks coloured by the step that produced them
                xs = [t - t0 for t, w in zip(times, why) if w == cause]
                label = None if cause in seen else (cause or "token")
                seen.add(cause)
                ax.plot(xs, [i] * len(xs), "|", ms=3, color=CAUSE_COLORS.get(cause, "tab:blue"), label=label)
            ax.plot([start - t0], [i], ">", ms=3, color="tab:red")  # sent
            if times:
                ax.plot([times[0] - t0], [i], "o", ms=3, color="tab:green")  # first token
        ax.set_xlabel("seconds since the first request (red: sent, green: first token, ticks: tokens by step kind)")
        ax.legend(loc="upper left", fontsize=7)
        ax.set_ylabel("request")
        ax.set_title(f"token timeline: {name}")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out_dir, f"timeline-{name}.png"), dpi=110)
    print(f"wrote {args.out_dir}/cdf.png and {len(runs)} timeline(s)")
    return 0


def add_args(p) -> None:
    p.add_argument("results", nargs="+")
    p.add_argument("--out-dir", default="results/plots")
