"""Put an engine together: knobs (resolved first) -> model -> runner -> scheduler -> engine."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

from .config import PREFIX, KnobError, ServingConfig
from .engine.loop import Engine
from .engine.pages import PAGE_SIZE, KVBook, budget_pool_pages, pool_bytes, pool_pages
from .engine.scheduler import Scheduler


def available_ram(
    meminfo: str = "/proc/meminfo", cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int:
    """Bytes of memory a new allocation can have now without swapping: the kernel's MemAvailable,
    which counts reclaimable page cache (sysconf's AVPHYS_PAGES counts only free pages: on a
    machine whose cache had filled after reading the weights it read 370 MB of 24 GB, and the auto
    KV budget refused to start), and no more than this process's memory cgroup leaves (`cgroup_room`):
    in a container MemAvailable is the host's, and a budget sized from it is killed at the
    container's limit. Falls back to free pages where there is no /proc/meminfo."""
    host = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if host is None:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    room = cgroup_room(cgroups, root)
    return host if room is None else min(host, room)


def cgroup_room(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """What the memory limits of this process's cgroup and its ancestors leave: the least of
    limit - (usage - inactive file cache) over the levels that set one (v2 `memory.max` /
    `memory.current`, v1 `memory.limit_in_bytes` / `memory.usage_in_bytes`; inactive file pages are
    reclaimable, as `docker stats` counts). None where no level sets a limit or none can be read."""
    try:
        lines = open(cgroups).read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if ctrl == "" and path:  # v2: one unified hierarchy
            found.append((root, path, "memory.max", "memory.current", "inactive_file"))
        elif "memory" in ctrl.split(","):  # v1: the memory controller's own hierarchy
            found.append(
                (
                    os.path.join(root, "memory"),
                    path,
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    "total_inactive_file",
                )
            )
    rooms = []
    for base, path, limit_f, usage_f, inactive in found:
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the group itself, then each ancestor
            d = os.path.join(base, *parts[:depth])
            try:
                raw = open(os.path.join(d, limit_f)).read().strip()
                usage = int(open(os.path.join(d, usage_f)).read())
            except (OSError, ValueError):
                continue
            if raw == "max" or int(raw) >= 1 << 60:  # no limit at this level (v1 writes a huge number)
                continue
            cache = 0
            try:
                for row in open(os.path.join(d, "memory.stat")):
                    key, _, val = row.partition(" ")
                    if key == inactive:
                        cache = int(val)
                        break
            except (OSError, ValueError):
                pass
            rooms.append(max(0, int(raw) - max(0, usage - cache)))
    return min(rooms) if rooms else None


def check_kv_budget(spec, config: ServingConfig, kv_dtype) -> None:
    """An explicit KV_CACHE_MB too small for one MAX_CONTEXT-token request refuses from the model's
    shapes alone, before any weights load (KnobError naming the minimum MiB). `config` must have
    its MAX_CONTEXT settled (with_model_limit); `auto` depends on the RAM free after loading and is
    checked in build_engine."""
    from .model.runtime.kv_cache import token_bytes

    if not isinstance(config.kv_cache_mb, int):
        return
    window = spec.sliding_window if spec.has_sliding else None
    try:
        budget_pool_pages(
            config.kv_cache_mb << 20,
            token_bytes(spec, kv_dtype),
            config.max_context,
            config.decode_slots,
            window,
            transient_prompts=config.mix_max_prompts,
        )
    except ValueError as e:
        raise KnobError(str(e)) from None


class PreflightError(ValueError):
    """The model cannot be served, found from its shapes alone (the message names the file)."""


def preflight(model: str, config: ServingConfig, dtype: str = "auto", kernels: str = "auto", device: str = "auto"):
    """Everything decided before a port binds or any weights load, so the HTTP side knows no model
    file formats: the kernel plan (KernelError for a choice this machine cannot run), the model's
    path (FileNotFoundError), its shapes from config.json or the GGUF header (PreflightError: a
    config we cannot run, a file that is not a model), and MAX_CONTEXT and an explicit KV budget
    against them (KnobError naming the minimum). `config` must come from `config.resolve`.
    Returns (the plan, the name the model is served under by default)."""
    from .model.kernels.choice import choose
    from .model.formats.weights import read_spec, resolve_model_path, served_name

    plan = choose(dtype, kernels, device)
    path = resolve_model_path(model)
    try:
        spec = read_spec(path)
    except (ValueError, KeyError, OSError) as e:
        raise PreflightError(f"cannot serve {path}: {e if isinstance(e, ValueError) else repr(e)}") from None
    check_kv_budget(spec, config.with_model_limit(spec.max_position), plan.kv)
    return plan, served_name(model)


def build_engine(
    model: str,
    config: ServingConfig,
    dtype: str = "auto",
    device: str = "auto",
    loaded=None,
    clock=time.monotonic,
    log=lambda m: print(m, file=sys.stderr),
    kernels: str = "auto",
    ram_bytes: int | None = None,
):
    """Returns (engine not yet started, loaded model, settled config). `config` must come from
    `config.resolve`, so every knob was checked before this touches any weights."""
    from .model.kernels import probe
    from .model.runtime.executor import ModelExecutor
    from .model.kernels.choice import choose
    from .model.runtime.kv_cache import token_bytes
    from .model.runtime.runner import ModelRunner
    from .model.formats.weights import load_model, release_free_heap

    plan = choose(dtype, kernels, device)  # a choice this machine cannot run refuses before loading
    log(plan.line())
    if config.async_prefill and plan.device != "cpu":
        raise KnobError(f"{PREFIX}ASYNC_PREFILL={config.async_prefill!r} is a CPU worker; on {plan.device} use off")
    m = loaded or load_model(model, log=log)
    cfg = config.with_model_limit(m.spec.max_position)
    window = m.spec.sliding_window if m.spec.has_sliding else None
    runner = ModelRunner(m.spec, m.weights, None, plan=plan)  # weights first: the KV is sized after them
    pages, cfg, kv = kv_pools(m.spec, cfg, token_bytes(m.spec, plan.kv), ram_bytes, log)
    runner.hold_kv(pages)
    log(resident_line(runner, m.source))
    book = KVBook(pages["global"], pages.get("local"), window)
    log(f"warm-up step: {runner.warm_up(book):.2f} s")
    # This CPU's step costs (model/kernels/probe.py): logged beside the kernels line, and the inter-token
    # target's first prices.
    probed = probe.run(runner, book, m.source, log=log) if plan.device == "cpu" else None
    release_free_heap()
    lane = int(cfg.async_prefill.removeprefix("cpu:")) if cfg.async_prefill else None
    if lane:
        log(f"side lane: one prefill at a time on {lane} thread(s) of its own while the live batch decodes")
    sched = Scheduler(ModelExecutor(runner, lane_threads=lane), book, cfg, m.spec.vocab_size, clock=clock)
    engine = Engine(sched, clock=clock)
    engine.kv = kv
    if probed is not None:
        engine.probe = probed.as_dict()
        if sched.costs is not None:
            probe.seed(sched.costs, probed)
        if isinstance(cfg.itl_target_ms, int):  # a tail budget: what it holds on this CPU
            log(probed.budget_line(cfg.itl_target_ms, min(probe.BUDGET_STREAMS, cfg.decode_slots), cfg.max_context))
    return engine, m, cfg


def kv_report(pages: dict[str, int], token_bytes: dict[str, int], cfg: ServingConfig, rule: str) -> dict:
    """What the KV pools hold, for the log and /version: MiB, the global pool's tokens (the context
    all live requests share; less the padding page), as MAX_CONTEXT-long requests, and the rule that
    sized it."""
    tokens = (pages["global"] - 1) * PAGE_SIZE
    return {
        "mib": pool_bytes(pages, token_bytes) >> 20,
        "tokens": tokens,
        "contexts": tokens / cfg.max_context,
        "slots": cfg.decode_slots,
        "max_context": cfg.max_context,
        "preempts": bool(cfg.kv_cache_mb),
        "rule": rule,
    }


def kv_pools(spec, cfg: ServingConfig, tb: dict[str, int], ram_bytes: int | None, log):
    """The KV pools, the config with its budget settled, and their report (`kv_report`). Called
    once the runner holds its weights in the kernels' forms, so `auto` reads the RAM left after
    them (at Llama 3.2 3B's shape the panels are ~3 GB that a budget read before them counted as
    free). Whole-prompt admission: up to mix_max_prompts prompts hold full-length sliding pages
    during their prefill step, on top of one window per slot."""
    window = spec.sliding_window if spec.has_sliding else None
    pages = pool_pages(cfg.max_context, cfg.decode_slots, window, transient_prompts=cfg.mix_max_prompts)
    budget_mb = cfg.kv_cache_mb
    need = pool_bytes(pages, tb)
    rule = "KV_CACHE_MB" if budget_mb else "DECODE_SLOTS x MAX_CONTEXT (KV_CACHE_MB=off)"
    if budget_mb == "auto":  # slots x context while it fits half the free RAM, else that half
        share = (available_ram() if ram_bytes is None else ram_bytes) // 2
        budget_mb = share >> 20 if need > share else None
        rule = (
            f"auto: DECODE_SLOTS x MAX_CONTEXT needs {need >> 20} MiB, over half the RAM available ({share >> 20} "
            "MiB), so that half, with preemption"
            if budget_mb
            else f"auto: DECODE_SLOTS x MAX_CONTEXT fits half the RAM available ({share >> 20} MiB)"
        )
    cfg = replace(cfg, kv_cache_mb=budget_mb)
    if budget_mb:  # a budget: the global pool holds what fits, live rows may be preempted
        pages = budget_pool_pages(
            budget_mb << 20, tb, cfg.max_context, cfg.decode_slots, window, transient_prompts=cfg.mix_max_prompts
        )
    kv = kv_report(pages, tb, cfg, rule)
    log(
        f"KV cache: {kv['mib']} MiB, {kv['tokens']} tokens of context at once ({kv['contexts']:.2f} x "
        f"MAX_CONTEXT={cfg.max_context}; {cfg.decode_slots} slots); {rule}"
    )
    return pages, cfg, kv


def resident_line(runner, source) -> str:
    """One line: the weights' resident size by form, beside the model file's, and the process's RSS."""
    from .model.runtime.runner import resident_bytes

    held = resident_bytes(runner.w)
    mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
    size = sum(f.stat().st_size for f in ([source] if source.is_file() else source.glob("*.safetensors")))
    try:
        with open("/proc/self/status") as f:
            rss = next((int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS")), 0)
    except OSError:  # not Linux
        rss = 0
    from .model.kernels.blocks import PanelRows

    lookups = (
        "; embedding lookups read the head's panels"
        if isinstance(runner.w.get("embed"), PanelRows)
        else f"; {mib(held['mapped'])} of stored blocks mapped for lookups"
        if held["mapped"]
        else ""
    )
    return (
        f"weights resident: {mib(held['kernels'] + held['tensors'])} ({mib(held['kernels'])} in the kernels' "
        f"forms, {mib(held['tensors'])} other tensors{lookups}) for a {mib(size)} model file; process RSS {mib(rss)}"
    )
