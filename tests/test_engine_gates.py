"""Engine-level gates: a live engine thread on the real Gemma 3 270M."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tailgate.engine.request import Finished, Rejected, Scheduled
from tailgate.model.runtime import serial
from harness import Harness, ManualClock, ids, shared_weights


@pytest.fixture(scope="module")
def gemma(loaded):
    return loaded("gemma3-270m")


def test_the_coalesce_door_releases_one_admission_burst(gemma):
    # The engine runs on a ManualClock: the 2 s window cannot run out however slow the host is,
    # so the release below can only be the cohort's.
    clock = ManualClock()
    with Harness(gemma, clock=clock, DECODE_SLOTS="4", ADMIT_COALESCE_MS="2000") as h:
        inc = h.submit(ids(40), max_tokens=400)
        assert h.wait(lambda: len(h.tokens(inc)) >= 2)
        with h.engine._cv:  # coincident: one intake turn sees both
            x, y = h.submit(ids(40, 1), max_tokens=4), h.submit(ids(40, 2), max_tokens=4)
        # Deep: (1 + 2) * 2 >= 4; cohort min(4, 3) = 3 > 2 pending: both held, the stream flows.
        assert h.wait(lambda: h.engine.snapshot.held == 2)
        before = len(h.tokens(inc))
        clock.advance(1.999)  # just short of the window
        assert h.wait(lambda: len(h.tokens(inc)) >= before + 3)  # intake turns ran at 1.999 s
        assert not h.of(x, Scheduled) and not h.of(y, Scheduled)
        assert h.engine.snapshot.held == 2
        z = h.submit(ids(40, 3), max_tokens=4)
        assert h.wait(lambda: all(h.of(r, Scheduled) for r in (x, y, z)))
        steps = {h.scheduled_step(r) for r in (x, y, z)}
        assert len(steps) == 1, "the cohort split across steps"
        assert all(len(h.of(r, Scheduled)) == 1 for r in (x, y, z))
        assert h.wait(lambda: all(h.done(r) for r in (x, y, z)))
        assert all(len(h.tokens(r)) == 4 for r in (x, y, z))
        assert dict(h.engine.snapshot.metrics.door_releases) == {"cohort": 1}
        h.engine.abort(inc)


def test_a_short_window_releases_an_incomplete_cohort(gemma):
    # On a ManualClock the window runs out when the test moves the clock past it, not when the host
    # has spent 20 ms: held at 19 ms, released at the first turn at 21 ms.
    clock = ManualClock()
    with Harness(gemma, clock=clock, DECODE_SLOTS="4", ADMIT_COALESCE_MS="20") as h:
        inc = h.submit(ids(40), max_tokens=400)
        assert h.wait(lambda: len(h.tokens(inc)) >= 2)
        with h.engine._cv:  # coincident: one intake turn holds both, one window for both
            x, y = h.submit(ids(40, 1), max_tokens=3), h.submit(ids(40, 2), max_tokens=3)
        assert h.wait(lambda: h.engine.snapshot.held == 2)
        before = len(h.tokens(inc))
        clock.advance(0.019)
        assert h.wait(lambda: len(h.tokens(inc)) >= before + 3)  # intake turns ran at 19 ms
        assert not h.of(x, Scheduled) and not h.of(y, Scheduled)
        clock.advance(0.002)
        assert h.wait(lambda: h.of(x, Scheduled) and h.of(y, Scheduled))
        assert h.scheduled_step(x) == h.scheduled_step(y)
        sx = h.of(x, Scheduled)[0]
        assert sx.at - sx.queued_at == pytest.approx(0.021)  # released at the first turn past the window
        assert h.wait(lambda: h.done(x) and h.done(y))
        assert dict(h.engine.snapshot.metrics.door_releases) == {"window": 1}
        h.engine.abort(inc)


def test_the_slots_hold_at_the_roster_edge(gemma):
    with Harness(gemma, DECODE_SLOTS="2") as h:
        a = h.submit(ids(20), max_tokens=30)
        b = h.submit(ids(20, 1), max_tokens=400)
        assert h.wait(lambda: len(h.tokens(a)) >= 1 and len(h.tokens(b)) >= 1)
        c = h.submit(ids(20, 2), max_tokens=5)
        assert h.wait(lambda: h.engine.waiting == 1 and len(h.sched.roster) == 2)
        n = len(h.tokens(b))
        assert h.wait(lambda: len(h.tokens(b)) >= n + 3 or h.done(a))  # intake turns ran with c waiting
        assert not h.of(c, Scheduled) or h.done(a)  # held while both slots are taken
        assert h.wait(lambda: h.done(a))
        assert h.wait(lambda: h.done(c))
        assert len(h.tokens(a)) == 30 and len(h.tokens(c)) == 5
        assert h.of(c, Scheduled)[0].at >= h.of(a, Finished)[0].at
        h.engine.abort(b)


def test_an_idle_refill_matches_a_fresh_engine(gemma):
    prompts = [ids(30, s) for s in range(3)]

    def episode(h):
        # Coincident arrivals (under the engine's lock): every episode admits them in the same
        # steps. Submitted one by one, the grouping depended on timing, and on a plan whose large
        # calls are not batch-invariant (AMX: prepacked bf16 above 8 rows) a prompt prefilled in a
        # different group could flip a near-tie: a fresh-clone CI run failed that way.
        with h.engine._cv:
            rs = [h.submit(p, max_tokens=12) for p in prompts]
        assert h.wait(lambda: all(h.done(r) for r in rs))
        return [h.tokens(r) for r in rs]

    with Harness(gemma) as h:
        first = episode(h)
        assert h.wait(lambda: not h.sched.has_work())
        second = episode(h)  # the roster drained: a new episode starts from an idle engine
    with Harness(gemma) as fresh:
        assert episode(fresh) == second == first


def test_the_gathered_lifecycle_completes(gemma):
    with Harness(gemma, DECODE_SLOTS="4") as h:
        inc = h.submit(ids(20), max_tokens=400)
        assert h.wait(lambda: len(h.tokens(inc)) >= 1)
        # Hold the engine's intake briefly so all four land in one queue together.
        with h.engine._cv:
            dead = h.submit(ids(20, 1), max_tokens=4)
            h.engine.abort(dead)
            empty = h.submit([], max_tokens=4)
            bad = h.submit(ids(20, 2) + [10**7], max_tokens=4)
            ok = h.submit(ids(20, 3), max_tokens=4)
        assert h.wait(lambda: h.done(ok))
        assert h.of(dead, Finished)[0].reason == "abort"
        assert "empty" in h.of(empty, Rejected)[0].reason
        assert "outside the vocabulary" in h.of(bad, Rejected)[0].reason
        assert len(h.tokens(ok)) == 4 and h.of(ok, Finished)[0].reason == "length"
        h.engine.abort(inc)


def test_gathered_output_is_token_exact_vs_serial(gemma, rig):
    r = rig("gemma3-270m", "fp32")
    prompts = [ids(24, s) for s in range(4)]
    want = [serial.generate(r.runner, r.book, p, 10) for p in prompts]
    with Harness(gemma, dtype="fp32", DECODE_SLOTS="8") as h:
        with h.engine._cv:  # four coincident arrivals: one solo, then three gathered in one mixed step
            rs = [h.submit(p, max_tokens=10) for p in prompts]
        assert h.wait(lambda: all(h.done(x) for x in rs))
        assert h.scheduled_step(rs[1]) == h.scheduled_step(rs[3])
        assert [h.tokens(x) for x in rs] == want


@pytest.mark.parametrize(
    "env,knob",
    [
        ({"TAILGATE_ADMIT_COALESCE_MS": "5000"}, "TAILGATE_ADMIT_COALESCE_MS"),
        ({"TAILGATE_DECODE_SLOTS": "0"}, "TAILGATE_DECODE_SLOTS"),
        ({"TAILGATE_ADMIT_COALESCE_MS": "300", "TAILGATE_ASYNC_PREFILL": "shared"}, "TAILGATE_ADMIT_COALESCE_MS"),
        ({"TAILGATE_KERNELS": "int9"}, "TAILGATE_KERNELS"),
        ({"TAILGATE_MIX_CHUNK_TOKENS": "63"}, "TAILGATE_MIX_CHUNK_TOKENS"),
    ],
)
def test_bad_knobs_refuse_before_any_weights_load(env, knob, tmp_path):
    # A model path that does not exist: if knobs were checked after loading, the error would be about it.
    # The caller's own TAILGATE_* settings stay out (one of them could be refused first, or be the
    # name the assertion finds): the refusal must name the knob under test and its value.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TAILGATE_")}
    p = subprocess.run(
        [sys.executable, "-m", "tailgate.cli", "serve", "--model", str(tmp_path / "missing.gguf")],
        env={**clean, **env, "TAILGATE_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert knob in p.stderr and repr(env[knob]) in p.stderr and "missing.gguf" not in p.stderr, p.stderr
    assert not any(tmp_path.iterdir())


def test_a_walked_prompt_is_token_exact_vs_serial_while_a_stream_is_live(gemma, rig):
    r = rig("gemma3-270m", "fp32")
    long_prompt, short = ids(600, 3), ids(20, 4)  # 600 rows cross the 512-token sliding window
    want = [serial.generate(r.runner, r.book, p, 6) for p in (short, long_prompt)]
    with Harness(gemma, dtype="fp32", DECODE_SLOTS="4", MIX_CHUNK_TOKENS="256") as h:
        live = h.submit(short, max_tokens=40)
        assert h.wait(lambda: len(h.tokens(live)) >= 1)
        walker = h.submit(long_prompt, max_tokens=6)
        assert h.wait(lambda: h.done(walker) and h.done(live))
        assert h.tokens(walker) == want[1] and h.tokens(live)[:6] == want[0]
        # three rounds (256 + 256 + 88 rows), each one step with the live row in it
        start = h.scheduled_step(walker)
        got = [
            sum(1 for e in evs if getattr(e, "request_id", None) == live.id and type(e).__name__ == "Token")
            for evs in h.steps[start : start + 3]
        ]
        assert got == [1, 1, 1]


def test_a_preempted_request_finishes_token_exact_and_the_pages_all_return(gemma, rig):
    import torch

    from tailgate.engine.pages import pool_pages
    from tailgate.model.runtime.kv_cache import token_bytes

    spec = gemma.spec
    # fp32 bytes of a global page, and the sliding pool's fixed share of the budget.
    tb = token_bytes(spec, torch.float32)
    glob_page = 16 * tb["global"]
    sliding = pool_pages(96, 3, spec.sliding_window, 3)["local"] * 16 * tb["local"]
    mb = next(m for m in range(1, 4096) if ((m << 20) - sliding) // glob_page >= 7)  # two fit, three do not
    assert ((mb << 20) - sliding) // glob_page < 9
    r = rig("gemma3-270m", "fp32")
    prompts = [ids(20, s) for s in (5, 6, 7)]
    want = [serial.generate(r.runner, r.book, p, 28) for p in prompts]  # 48 tokens = 3 pages each
    with Harness(gemma, dtype="fp32", DECODE_SLOTS="3", MAX_CONTEXT="96", KV_CACHE_MB=str(mb)) as h:
        with h.engine._cv:
            rs = [h.submit(p, max_tokens=28) for p in prompts]
        assert h.wait(lambda: all(h.done(x) for x in rs), 600)
        assert h.sched.metrics.preemptions >= 1
        assert [h.tokens(x) for x in rs] == want


def test_the_auto_kv_budget_is_half_the_free_ram_when_slots_times_context_do_not_fit(gemma):
    import torch

    from tailgate.assemble import build_engine
    from tailgate.config import resolve
    from tailgate.engine.pages import pool_pages
    from tailgate.model.runtime.kv_cache import token_bytes

    cfg = resolve(lambda name: {"DECODE_SLOTS": "64", "MAX_CONTEXT": "2048"}.get(name))
    full = pool_pages(2048, 64, gemma.spec.sliding_window, cfg.mix_max_prompts)
    tb = token_bytes(gemma.spec, torch.float32)
    sliding_mb = full["local"] * 16 * tb["local"] >> 20
    lines: list[str] = []
    ram = (sliding_mb + 200) << 21  # half of it: the sliding pool plus 200 MiB of global pages
    with shared_weights():  # the pools are under test, not the weights: the session's fp32 ones
        roomy, _, c1 = build_engine(
            "", cfg, dtype="fp32", device="cpu", loaded=gemma, ram_bytes=1 << 40, log=lines.append
        )
        tight, _, c2 = build_engine("", cfg, dtype="fp32", device="cpu", loaded=gemma, ram_bytes=ram, log=lines.append)
    assert c1.kv_cache_mb is None and c2.kv_cache_mb == sliding_mb + 200
    assert roomy.scheduler.book.glob.capacity == full["global"] - 1  # a full context per slot (+1: padding)
    assert tight.scheduler.book.glob.capacity < full["global"] // 2
    assert any(
        f"over half the RAM available ({sliding_mb + 200} MiB), so that half, with preemption" in line for line in lines
    )
    # what the log and /version say the pools hold: MiB, tokens at once, as MAX_CONTEXT-long requests
    assert roomy.kv["tokens"] == 64 * 2048 and roomy.kv["contexts"] == 64 and not roomy.kv["preempts"]
    assert tight.kv["tokens"] == tight.scheduler.book.glob.capacity * 16 and tight.kv["preempts"]
    assert tight.kv["mib"] <= sliding_mb + 200 < roomy.kv["mib"]
    assert roomy.kv["rule"].startswith("auto: DECODE_SLOTS x MAX_CONTEXT fits half the RAM available")
    assert any(
        f"KV cache: {tight.kv['mib']} MiB, {tight.kv['tokens']} tokens of context at once" in line for line in lines
    )


def test_the_auto_kv_budget_reads_the_ram_left_once_the_weights_hold_their_kernel_forms(gemma, monkeypatch):
    """The runner sizes its pools after it prepared its weights (panels can be GBs at 3B), so
    `auto` reads MemAvailable then, not before they were made."""
    from tailgate import assemble
    from tailgate.config import resolve
    from tailgate.model.runtime import runner

    order = []
    monkeypatch.setattr(assemble, "available_ram", lambda: (order.append("ram"), 1 << 40)[1])
    cfg = resolve(lambda name: {"DECODE_SLOTS": "2", "MAX_CONTEXT": "256"}.get(name))
    with shared_weights():
        prepare = runner.prepare_weights  # (the session's shared one; put back before the block ends)
        runner.prepare_weights = lambda *a, **k: (order.append("weights"), prepare(*a, **k))[1]
        try:
            engine, _, settled = assemble.build_engine("", cfg, dtype="fp32", device="cpu", loaded=gemma, log=print)
        finally:
            runner.prepare_weights = prepare
    assert order == ["weights", "ram"] and settled.kv_cache_mb is None and engine.kv["tokens"] == 2 * 256


def test_the_ram_the_budget_sees_counts_reclaimable_cache(tmp_path):
    from tailgate.assemble import available_ram

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24730624 kB\nMemFree:          378880 kB\nMemAvailable:   23634944 kB\n")
    nocg = str(tmp_path / "no-cgroup")  # (this host's own cgroups aside)
    assert available_ram(str(info), nocg) == 23634944 * 1024  # not MemFree: the page cache is reclaimable
    assert available_ram(str(tmp_path / "absent"), nocg) > 0  # no /proc/meminfo: free pages


def test_the_ram_the_budget_sees_is_no_more_than_the_memory_cgroup_leaves(tmp_path):
    """In a container MemAvailable is the host's: the auto KV budget reads the least room any
    memory cgroup level leaves (limit - usage + inactive file cache), v2 and v1 layouts alike."""
    from tailgate.assemble import available_ram, cgroup_room

    info = tmp_path / "meminfo"
    info.write_text("MemAvailable:   23634944 kB\n")
    gib = 1 << 30
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "kubepods" / "memory.max").write_text(f"{16 * gib}\n")  # the limit is set one level up
    (v2 / "kubepods" / "memory.current").write_text(f"{3 * gib}\n")
    (v2 / "kubepods" / "memory.stat").write_text(f"anon 1\ninactive_file {gib}\nactive_file 5\n")
    (v2 / "kubepods" / "pod1" / "memory.max").write_text("max\n")
    (v2 / "kubepods" / "pod1" / "memory.current").write_text(f"{2 * gib}\n")
    own = tmp_path / "self-v2"
    own.write_text("0::/kubepods/pod1\n")
    assert cgroup_room(str(own), str(v2)) == 14 * gib  # 16 - (3 - 1 reclaimable)
    assert available_ram(str(info), str(own), str(v2)) == 14 * gib  # under the host's 22.5 GiB
    v1 = tmp_path / "v1"
    (v1 / "memory" / "tg16").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # the root: no limit
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{20 * gib}\n")
    (v1 / "memory" / "tg16" / "memory.limit_in_bytes").write_text(f"{16 * gib}\n")
    (v1 / "memory" / "tg16" / "memory.usage_in_bytes").write_text(f"{gib}\n")
    own1 = tmp_path / "self-v1"
    own1.write_text("9:name=systemd:/\n4:memory:/tg16\n0::/\n")
    assert cgroup_room(str(own1), str(v1)) == 15 * gib
    unlimited = tmp_path / "self-root"
    unlimited.write_text("4:memory:/\n")
    assert cgroup_room(str(unlimited), str(v1)) is None  # no level sets a limit: MemAvailable alone
    assert available_ram(str(info), str(unlimited), str(v1)) == 23634944 * 1024
    assert cgroup_room(str(tmp_path / "absent"), str(v1)) is None


def test_a_sink_that_raises_cancels_only_its_own_request(gemma):
    with Harness(gemma, DECODE_SLOTS="4") as h:
        good = h.submit(ids(30, 1), max_tokens=16)

        def broken(ev):
            raise RuntimeError("client went away badly")

        bad = h.submit(ids(30, 2), max_tokens=400)
        bad.sink = broken
        assert h.wait(lambda: h.done(good), 300)
        assert len(h.tokens(good)) == 16 and h.engine.error is None
        assert h.wait(lambda: not h.sched.has_work(), 300)  # the broken one was cancelled, its pages back


def test_a_dead_engine_fails_open_and_new_requests_at_once(gemma):
    h = Harness(gemma, DECODE_SLOTS="4")
    seen = []
    h.engine.on_death.append(seen.append)
    live = h.submit(ids(30, 3), max_tokens=400)
    assert h.wait(lambda: len(h.tokens(live)) >= 2)

    def fault(now):  # injected: the scheduler itself raises (a failed model step is confined to its rows)
        raise RuntimeError("injected scheduler failure")

    h.sched.step = fault
    end = time.monotonic() + 60
    while not (h.done(live) and seen) and time.monotonic() < end:  # h.wait would re-raise the engine's error
        time.sleep(0.01)
    assert h.of(live, Finished)[-1].reason == "error" and seen and h.engine.error is not None
    late = h.submit(ids(30, 4), max_tokens=4)
    assert h.done(late) and h.of(late, Finished)[-1].reason == "error"  # at once, not hanging
    h.engine.stop()


def test_the_engine_publishes_a_snapshot_that_later_steps_do_not_touch(gemma):
    with Harness(gemma, DECODE_SLOTS="4") as h:
        r = h.submit(ids(30, 5), max_tokens=12)
        assert h.wait(lambda: len(h.tokens(r)) >= 4)
        snap = h.engine.snapshot
        frozen = (snap.metrics.generation_tokens, snap.running, snap.kv_pages_used)
        assert frozen[0] >= 3 and frozen[1] == 1 and frozen[2] > 0
        assert h.wait(lambda: h.done(r))
        assert h.wait(lambda: h.engine.snapshot.running == 0)
        assert (snap.metrics.generation_tokens, snap.running, snap.kv_pages_used) == frozen  # a copy, not a view
        assert h.engine.snapshot.metrics.generation_tokens >= 12 and h.engine.snapshot.kv_pages_used == 0


def test_a_warm_prefix_resume_reports_cached_tokens_and_is_token_exact_vs_cold(gemma, rig):
    # 700 shared tokens cross the 512-token sliding window. A short prompt, cached too, comes back
    # with its token 50 changed: only the pages before it may be reused.
    r = rig("gemma3-270m", "fp32")
    base, short = ids(700, 11), ids(100, 14)
    warm, changed = base + ids(30, 12), list(short) + ids(20, 13)
    changed[50] += 1
    want = [serial.generate(r.runner, r.book, p, 6) for p in (warm, changed)]
    with Harness(gemma, dtype="fp32", DECODE_SLOTS="4", PREFIX_CACHE="4") as h:
        for p in (base, short):
            x = h.submit(p, max_tokens=4)
            assert h.wait(lambda: h.done(x), 300)
        a = h.submit(warm, max_tokens=6)
        assert h.wait(lambda: h.done(a), 300)
        b = h.submit(changed, max_tokens=6)
        assert h.wait(lambda: h.done(b), 300)
        assert h.of(a, Scheduled)[0].cached_tokens == 688  # 43 whole pages of the 700
        assert h.of(b, Scheduled)[0].cached_tokens == 48  # the pages before the changed token only
        assert [h.tokens(a), h.tokens(b)] == want
        assert h.sched.metrics.prefix_hits == 688 + 48
