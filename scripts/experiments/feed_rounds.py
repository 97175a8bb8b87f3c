"""What the rounds of traced arms were (`socket_tail_arm.sh` with TRACE=1 keeps NAME.feed, the
server's step trace): per arm, the client's tok/s and ITL p99 (NAME.bench.log), the ridden rounds'
prompt rows, and the median step of the most common ridden shape (the walk's full-width round
beside at least `--deep` live rows), which is the host's speed in that arm: two arms whose rounds
are the same shape differ in client ITL only by it. The last column is the client's ITL p99 in
units of that step, a tail figure the host's drift between arms mostly cancels from. `--totals`
adds, per arm, what its steps held and took: seconds of steps (all, with prompt rows, decode-only),
decode and prompt rows, and how many rounds took each prompt-row count (the rows the default's
schedule spent against the walk's, for the same work).

    .venv/bin/python scripts/experiments/feed_rounds.py [--rows 64] [--deep 13] [--totals] DIR/*.feed
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics

from replay_step_trace import steps  # the feed's steps, in order (this directory, as the script's)


def client(path: str) -> tuple[float, float]:
    text = open(path.removesuffix(".feed") + ".bench.log").read()
    tok = float(re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", text).group(1))
    itl = float(re.search(r"P99 ITL \(ms\):\s+([\d.]+)", text).group(1))
    return tok, itl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64, help="the full round's prompt rows (the walk's width)")
    ap.add_argument("--deep", type=int, default=13, help="live rows a ridden round needs to count")
    ap.add_argument("--totals", action="store_true", help="each arm's step seconds, rows and round widths too")
    ap.add_argument("feeds", nargs="+")
    a = ap.parse_args()
    for path in a.feeds:
        st = steps(path)
        ridden = [s for s in st if s["prompt_rows"] and s["decode_rows"]]
        shape = collections.Counter(s["prompt_rows"] for s in ridden)
        full = [s["duration_s"] * 1e3 for s in ridden if s["prompt_rows"] == a.rows and s["decode_rows"] >= a.deep]
        tok, itl = client(path)
        unit = statistics.median(full) if full else float("nan")
        print(
            f"{path.rsplit('/', 1)[-1]}: tok/s {tok:.1f}, ITL p99 {itl:.1f} ms; {len(st)} steps, "
            f"{len(ridden)} ridden rounds ({shape[a.rows]} at {a.rows} rows, "
            f"{sum(v for k, v in shape.items() if k < a.rows)} narrower, "
            f"{sum(v for k, v in shape.items() if k > a.rows)} wider); full ridden round p50 {unit:.1f} ms "
            f"(n={len(full)}); ITL p99 = {itl / unit:.3f} of it"
        )
        if a.totals:
            rounds = [s for s in st if s["prompt_rows"]]
            busy = sum(s["duration_s"] for s in st)
            mixed = sum(s["duration_s"] for s in rounds)
            widths = sorted(collections.Counter(s["prompt_rows"] for s in rounds).items())
            print(
                f"  {len(rounds)} rounds with prompt rows; steps took {busy:.1f} s ({mixed:.1f} s with prompt "
                f"rows, {busy - mixed:.1f} s decode-only); {sum(s['decode_rows'] for s in st)} decode rows, "
                f"{sum(s['prompt_rows'] for s in st)} prompt rows; rounds by prompt rows {widths}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
