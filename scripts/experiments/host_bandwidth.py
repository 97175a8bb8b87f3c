"""The host's memory read bandwidth right now: the best of REPS sums over a 1 GiB fp32 tensor on torch's
default threads (one per core), printed as one line for a benchmark log.

Why it sits beside a benchmark: a decode step reads every weight once, so single-stream TPOT follows
this figure, and on the 2-core AMD EPYC Zen 5 (family 26) VMs it moved 2x within minutes
(34.5 to 68.3 GiB/s between the pairs of one five-minute c1_paired.sh run,
docs/benchmarks/raw-sizes-qwen3-4b-c1-pairs-zen5.log, nothing else running). An arm whose TPOT stands
out can then be told from a host that slowed down.
    .venv/bin/python scripts/experiments/host_bandwidth.py [REPS]     (default 5)
"""

import sys
import time

import torch


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    big = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB, far past the L3
    big.sum()  # first touch outside the timing
    seen = []
    for _ in range(reps):
        t = time.perf_counter()
        big.sum()
        seen.append(1.0 / (time.perf_counter() - t))
    print(f"host read bandwidth {max(seen):.1f} GiB/s (best of {reps}; worst {min(seen):.1f})")


if __name__ == "__main__":
    main()
