"""How much memory a loaded model holds beside torch itself (issue 27), and where it goes.

Run (niced on a shared host):
    nice -n 19 .venv/bin/python scripts/experiments/resident_weights.py [--model gemma3-270m] [--smaps]

Prints, for `--model` loaded as `tailgate serve` loads it (`assemble.build_engine`: the weights, the
tokenizer, the runner's kernel forms, the KV pools, the warm-up step), with the smallest
KV_CACHE_MB the server accepts at the default MAX_CONTEXT / DECODE_SLOTS:
  - the RSS of a bare `python -c "import torch"` (a fresh process, median of 3),
  - this process's RSS after the load, and after it minus the KV pools (not weights: they are
    torch.zeros tensors, all resident, whose bytes are known exactly and subtracted),
  - the model file's size and the ratio (RSS after load - bare torch - KV pools) / file,
  - the cache on disk for this file (tailgate's conversion cache entry) and its ratio,
  - the time from this process's start to the engine being ready (imports included), wall and CPU
    (a shared host may pause or starve the process: the CPU seconds move less),
and, with --smaps, the resident bytes per mapping (anonymous heap, the model file, libraries).
The stages' RSS (after imports, after load_model: tokenizer + mapped file, after the runner) say
which part takes what. Figures on a loaded host move by a few MiB between runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys

MIB = 1 << 20


def rss_bytes(pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS"))


def seconds_since_start() -> float:
    """Seconds since this process started (/proc/self/stat's start time against /proc/uptime)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return up - start_ticks / os.sysconf("SC_CLK_TCK")


def bare_torch_rss(reps: int = 3) -> int:
    code = "import torch\nfor l in open('/proc/self/status'):\n    l.startswith('VmRSS') and print(int(l.split()[1]) << 10)"
    return int(
        statistics.median(int(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(reps))
    )


def smaps_by_mapping() -> dict[str, tuple[int, int]]:
    """Resident bytes per mapping name ([heap], [anon], a file path): (Rss, Anonymous)."""
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    name = None
    with open("/proc/self/smaps") as f:
        for line in f:
            p = line.split()
            if p and "-" in p[0] and not p[0].endswith(":"):
                name = p[5] if len(p) > 5 else "[anon]"
            elif p[0] == "Rss:":
                out[name][0] += int(p[1]) << 10
            elif p[0] == "Anonymous:":
                out[name][1] += int(p[1]) << 10
    return {k: (v[0], v[1]) for k, v in out.items()}


def smallest_kv_mb(spec, cfg, plan) -> int:
    """The least KV_CACHE_MB `check_kv_budget` accepts for these knobs (the refusal names it)."""
    from tailgate.engine.pages import budget_pool_pages
    from tailgate.model.runtime.kv_cache import token_bytes

    window = spec.sliding_window if spec.has_sliding else None
    tb = token_bytes(spec, plan.kv)
    for mb in range(1, 1 << 20):
        try:
            budget_pool_pages(
                mb << 20, tb, cfg.max_context, cfg.decode_slots, window, transient_prompts=cfg.mix_max_prompts
            )
            return mb
        except ValueError:
            continue
    raise RuntimeError("no KV budget fits")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--kv-cache-mb", default="min", help="min (the least the server accepts) | auto | N")
    ap.add_argument("--smaps", action="store_true", help="print resident bytes per mapping")
    args = ap.parse_args()

    import torch  # noqa: F401

    rss_torch = rss_bytes()
    from tailgate.assemble import build_engine
    from tailgate.config import resolve
    from tailgate.model.kernels.choice import choose
    from tailgate.model.formats.weights import _cache_dir, load_model, read_spec, resolve_model_path

    path = resolve_model_path(args.model)
    rss_imports = rss_bytes()
    spec = read_spec(path)
    env = {} if args.kv_cache_mb == "min" else {"TAILGATE_KV_CACHE_MB": args.kv_cache_mb}
    cfg = resolve(lambda name: env.get("TAILGATE_" + name)).with_model_limit(spec.max_position)
    plan = choose()
    kv_mb = smallest_kv_mb(spec, cfg, plan) if args.kv_cache_mb == "min" else args.kv_cache_mb
    cfg = resolve(lambda name: str(kv_mb) if name == "KV_CACHE_MB" else None)
    lines: list[str] = []
    m = load_model(args.model, log=lines.append)
    rss_loaded = rss_bytes()
    engine, m, settled = build_engine(args.model, cfg, loaded=m, log=lines.append)
    ready_s = seconds_since_start()
    t = os.times()
    ready_cpu = t.user + t.system  # all threads: a host that pauses or starves this process moves it less
    rss = rss_bytes()
    ex = engine.scheduler.executor
    while not hasattr(ex, "runner"):  # under a MeteredExecutor (ITL_TARGET_MS) the runner's executor is inside
        ex = ex.inner
    runner = ex.runner
    kv = sum(t.numel() * t.element_size() for d in (runner.kv.k, runner.kv.v) for t in d.values())
    size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.glob("*.safetensors"))
    cache = _cache_dir(path) if path.is_file() else None
    cache_bytes = sum(f.stat().st_size for f in cache.iterdir()) if cache is not None and cache.is_dir() else 0
    bare = bare_torch_rss()  # after `ready`, so the start time holds none of it
    held = rss - bare - kv
    for line in lines:
        if line.startswith(("kernels:", "weights resident")):
            print(line)
    print(f"model {path} ({size} bytes, {size / MIB:.1f} MiB)")
    print(
        f"bare `import torch` RSS {bare / MIB:.1f} MiB (median of 3 fresh processes); this process after "
        f"import torch {rss_torch / MIB:.1f}, after tailgate's imports {rss_imports / MIB:.1f}, after load_model "
        f"(tokenizer, mapped file) {rss_loaded / MIB:.1f}, after build_engine {rss / MIB:.1f} MiB"
    )
    print(
        f"KV pools {kv / MIB:.1f} MiB (KV_CACHE_MB={settled.kv_cache_mb}, MAX_CONTEXT={settled.max_context}, "
        f"DECODE_SLOTS={settled.decode_slots})"
    )
    print(
        f"RSS after load - bare torch = {(rss - bare) / MIB:.1f} MiB ({(rss - bare) / size:.2f}x the file); "
        f"minus the KV pools = {held / MIB:.1f} MiB = {held / 1e6:.1f} MB ({held / size:.2f}x the file)"
    )
    if cache is not None:
        print(f"cache on disk {cache}: {cache_bytes / MIB:.1f} MiB ({cache_bytes / size:.2f}x the file)")
    print(f"process start to ready: {ready_s:.1f} s wall, {ready_cpu:.1f} s of CPU (user + system, all threads)")
    if args.smaps:
        maps = smaps_by_mapping()
        for name, (r, anon) in sorted(maps.items(), key=lambda kv_: -kv_[1][0])[:12]:
            print(f"  {r / MIB:8.1f} MiB resident ({anon / MIB:.1f} anonymous)  {name}")
    print(
        json.dumps(
            {
                "bare_torch": bare,
                "rss": rss,
                "kv_pools": kv,
                "held": held,
                "file": size,
                "ratio": round(held / size, 3),
                "cache_bytes": cache_bytes,
                "ready_s": round(ready_s, 2),
                "ready_cpu_s": round(ready_cpu, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
