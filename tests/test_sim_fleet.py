"""`tailgate sim --replicas N --router ...` (tailgate/sim/fleet.py): N real schedulers behind the
fleet's routing policy on one virtual timeline."""

from __future__ import annotations

import json

from tailgate.cli import main
from tailgate.config import resolve
from tailgate.fleet.policy import RouterPolicy
from tailgate.sim import run as sim
from tailgate.sim.cost import CostModel
from tailgate.sim.fleet import prefix_workload, simulate_fleet

SCRIPTED = CostModel(floor=0.010, prompt_row=0.001, decode_row=0.002, attn_per_1k=0.0005)


def cfg(**knobs):
    return resolve(lambda name: knobs.get(name)).with_model_limit(32768)


def test_a_fleet_of_one_replica_is_the_single_scheduler_simulation():
    c = cfg(DECODE_SLOTS="4")
    jobs = sim.workload(24, 200, 16, 0.5, seed=1)
    alone, _ = sim.simulate(c, SCRIPTED, jobs, concurrency=3)
    fjobs = [(list(range(5000 + 300 * i, 5000 + 300 * i + il)), ol) for i, (il, ol) in enumerate(jobs)]
    fleet, ex = simulate_fleet(c, SCRIPTED, fjobs, 1, RouterPolicy("least-loaded"), concurrency=3)
    assert [r.chunk_times for r in fleet] == [r.chunk_times for r in alone]
    assert ex["requests_per_replica"] == [24]


def test_shared_prefixes_land_where_cached_and_different_ones_spread():
    # 4 system prompts of 512 tokens on 2 replicas with a prefix cache: the prefix router keeps
    # each prompt's repeats on one replica (their cached tokens >= 80 % of the prefix), spreads
    # the prompts over both, and every request finishes.
    c = cfg(PREFIX_CACHE="16", DECODE_SLOTS="8")
    jobs = prefix_workload(48, 576, 8, 512, 4, seed=2)
    res, ex = simulate_fleet(c, SCRIPTED, jobs, 2, RouterPolicy("prefix"), concurrency=4)
    assert all(r.success for r in res)
    heads: dict[tuple, list[int]] = {}
    for i, (p, _) in enumerate(jobs):
        heads.setdefault(tuple(p[:512]), []).append(i)
    assert len(heads) == 4
    homes = set()
    for members in heads.values():
        repeats = members[1:]
        # a repeat goes home unless the home was out of balance; most do, and those hit the cache
        home = max(set(ex["replica_of"][i] for i in members), key=[ex["replica_of"][i] for i in members].count)
        homes.add(home)
        at_home = [i for i in repeats if ex["replica_of"][i] == home]
        assert len(at_home) >= 0.75 * len(repeats)
        # each finds its prefix cached; one that arrives while the first is still walking it finds
        # the part walked so far (a walk round streams ride is priced: docs/engine.md)
        assert all(ex["cached_tokens"][i] > 0 for i in at_home)
        assert sum(ex["cached_tokens"][i] >= 0.8 * 512 for i in at_home) >= 0.8 * len(at_home)
    assert homes == {0, 1} and min(ex["requests_per_replica"]) > 0


def test_the_prefix_router_serves_more_prompt_tokens_from_cache_than_random_or_least_loaded():
    c = cfg(PREFIX_CACHE="4", DECODE_SLOTS="8")
    jobs = prefix_workload(64, 576, 8, 512, 6, seed=3)
    ratio = {
        kind: simulate_fleet(c, SCRIPTED, jobs, 2, RouterPolicy(kind, seed=3), concurrency=4)[1]["prefix_hit_ratio"]
        for kind in ("prefix", "least-loaded", "random")
    }
    assert ratio["prefix"] > max(ratio["least-loaded"], ratio["random"])


def test_sim_replicas_on_the_command_line_reports_the_fleet_and_is_reproducible(tmp_path, capsys):
    argv = [
        "sim",
        "--cost",
        "gemma4-12b-sm89",
        "--replicas",
        "2",
        "--router",
        "prefix",
        "--random-prefix-len",
        "256",
        "--prefix-groups",
        "3",
        "--random-input-len",
        "320",
        "--random-output-len",
        "8",
        "--num-prompts",
        "24",
        "--max-concurrency",
        "4",
        "--prefix-cache",
        "8",
    ]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(argv + ["--save-result", str(a)]) == 0
    assert "2 replicas, router prefix" in capsys.readouterr().out
    assert main(argv + ["--save-result", str(b)]) == 0
    out = json.loads(a.read_text())
    assert a.read_bytes() == b.read_bytes() and out["completed"] == 24 and sum(out["requests_per_replica"]) == 24
    assert out["prefix_hit_ratio"] > 0.5


def test_the_simulator_and_its_fleet_load_without_the_benchmark_http_client_or_torch():
    import subprocess
    import sys

    code = (
        "import sys, tailgate.sim.run, tailgate.sim.fleet; "
        "print('httpx' in sys.modules, 'torch' in sys.modules, 'ray' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["False", "False", "False"], p.stderr
