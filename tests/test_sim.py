"""The simulator: the real scheduler on a virtual clock with a scripted or preset cost model."""

from __future__ import annotations

import json

import pytest

import tailgate.config
import tailgate.engine.scheduler
from tailgate.cli import main
from tailgate.config import resolve
from tailgate.sim import run as sim
from tailgate.sim.cost import CostModel, fit, load_preset

# 10 ms a step, 1 ms a prompt row, 2 ms a decode row: times a person can add up.
SCRIPTED = CostModel(floor=0.010, prompt_row=0.001, decode_row=0.002)


def cfg(**knobs):
    return resolve(lambda name: knobs.get(name)).with_model_limit(32768)


def test_the_simulator_drives_the_unmodified_scheduler_and_knob_parser():
    assert sim.Scheduler is tailgate.engine.scheduler.Scheduler and sim.resolve is tailgate.config.resolve
    s = sim.build(cfg(), SCRIPTED, sim.VirtualClock())
    assert type(s) is tailgate.engine.scheduler.Scheduler


def test_virtual_time_gives_the_hand_computed_event_times():
    # A (10-token prompt, 3 tokens) at 0; B (5, 2) at 15 ms; whole-prompt admission (walk off); one
    # forward pass an iteration. t=0: A's solo prefill, 10 + 10 = 20 ms -> A1 at 20. t=20: B (due
    # at 15) is taken: a mixed step of B's 5 rows + A's row, 10 + 5 + 2 -> B1 and A2 at 37. t=37:
    # the decode round of A and B, 10 + 2 + 2 -> A3 (A done) and B2 at 51.
    res, s = sim.simulate(
        cfg(DECODE_SLOTS="4", MIX_CHUNK_TOKENS="off"), SCRIPTED, [(10, 3), (5, 2)], offsets=[0.0, 0.015]
    )
    assert [round(t, 9) for t in res[0].chunk_times] == [0.020, 0.037, 0.051]
    assert [round(t, 9) for t in res[1].chunk_times] == [0.037, 0.051]
    assert res[1].send == 0.015 and round(s["scheduled_at"][1], 9) == 0.020
    assert (s["iterations"], s["steps"]) == (3, 3) and all(r.success for r in res)


def test_a_lane_prefill_shares_the_machine_in_hand_computed_virtual_time():
    # green:50, the lane owns half the machine. A (10, 5) at 0, B (20, 2) at 15 ms, walk off.
    # A: prefill 20 ms -> A1 at 20. At 20 B goes to the lane: 30 ms of work at half speed, done at
    # 80. A's decode steps (12 ms of work) run at half speed meanwhile: A2 at 44, A3 at 68; A4's
    # straddles the lane's end (6 ms of work by 80, 6 at full speed) -> 86. At 86 the flight
    # lands: B1 at the landing, 86; then A5 and B2 in one decode step, 10 + 2 + 2 -> 100.
    c = resolve(
        lambda n: {"DECODE_SLOTS": "4", "MIX_CHUNK_TOKENS": "off", "ASYNC_PREFILL": "green:50"}.get(n),
        lanes=("cpu", "green"),
    ).with_model_limit(32768)
    res, s = sim.simulate(c, SCRIPTED, [(10, 5), (20, 2)], offsets=[0.0, 0.015])
    assert [round(t, 9) for t in res[0].chunk_times] == [0.020, 0.044, 0.068, 0.086, 0.100]
    assert [round(t, 9) for t in res[1].chunk_times] == [0.086, 0.100]
    assert round(s["scheduled_at"][1], 9) == 0.020 and all(r.success for r in res)
    assert sim.lane_share("cpu:1", cores=2) == 0.5 and sim.lane_share(None) == 0.0


def test_the_simulator_refuses_a_lane_it_cannot_price_and_a_lane_with_the_door(capsys):
    with pytest.raises(tailgate.config.KnobError, match="CUDA stream"):
        resolve(lambda n: {"ASYNC_PREFILL": "shared"}.get(n), lanes=("cpu", "green"))
    with pytest.raises(tailgate.config.KnobError, match="the door could only delay it"):
        resolve(lambda n: {"ASYNC_PREFILL": "green:50", "ADMIT_COALESCE_MS": "300"}.get(n), lanes=("cpu", "green"))


def test_the_door_releases_one_burst_under_the_simulator():
    # The engine gate (tests/test_engine_gates.py), on virtual time: slots 4, a live stream, two
    # arrivals held, the third completes the cohort and all three are admitted in one step.
    res, s = sim.simulate(
        cfg(DECODE_SLOTS="4", ADMIT_COALESCE_MS="2000"),
        SCRIPTED,
        [(40, 400), (40, 4), (40, 4), (40, 4)],
        offsets=[0.0, 0.1, 0.1, 1.0],
    )
    x, y, z = s["scheduled_at"][1:]
    assert x == y == z and z >= 1.0
    assert s["door_releases"] == {"cohort": 1} and all(len(r.chunk_times) == 4 for r in res[1:])


def test_a_short_door_window_releases_an_incomplete_cohort_under_the_simulator():
    res, s = sim.simulate(
        cfg(DECODE_SLOTS="4", ADMIT_COALESCE_MS="20"), SCRIPTED, [(40, 200), (40, 3), (40, 3)], offsets=[0.0, 0.1, 0.1]
    )
    x, y = s["scheduled_at"][1:]
    assert x == y and x - 0.1 >= 0.020
    assert s["door_releases"].get("window", 0) >= 1


def test_the_priced_door_spares_a_stream_its_last_tokens_stall_under_the_simulator():
    # Walk off. A lives long; D (30 rows) at 50 ms and B (6 tokens, the 5th at 216 ms, the last at
    # 230 ms door on) ride A; C (100 rows) arrives at 210 ms, so the next intake turn finds B one
    # token from its end. By then the engine's step-cost model has three steps with prompt rows at
    # two widths and decode steps (10 ms + 2 ms a row, 1 ms a prompt row): a one-step hold spares B
    # 100 ms of stall, so C waits for B's last token; A's end is seconds off, so the door then
    # admits C ("priced"). With the door off C rides B's last step (B's last token at 330 ms).
    # The model learns from these live steps alone (probe=False: no start-up probe's seeding).
    jobs, offsets = [(40, 400), (30, 3), (40, 6), (100, 3)], [0.0, 0.05, 0.1, 0.21]
    res, s = sim.simulate(
        cfg(DECODE_SLOTS="4", MIX_CHUNK_TOKENS="off", ADMIT_COALESCE_MS="auto"),
        SCRIPTED,
        jobs,
        offsets=offsets,
        probe=False,
    )
    b_end, c_at = res[2].chunk_times[-1], s["scheduled_at"][3]
    assert c_at >= b_end and c_at - 0.21 < 0.03 and s["door_releases"] == {"priced": 1}
    res, s = sim.simulate(cfg(DECODE_SLOTS="4", MIX_CHUNK_TOKENS="off"), SCRIPTED, jobs, offsets=offsets)
    assert s["scheduled_at"][3] < res[2].chunk_times[-1]


def _sim_json(tmp_path, seed, name):
    out = tmp_path / name
    assert (
        main(
            [
                "sim",
                "--cost",
                "gemma4-12b-sm89",
                "--num-prompts",
                "40",
                "--random-input-len",
                "512",
                "--random-output-len",
                "32",
                "--random-range-ratio",
                "0.5",
                "--request-rate",
                "4",
                "--seed",
                str(seed),
                "--save-result",
                str(out),
            ]
        )
        == 0
    )
    return out.read_bytes()


def test_the_same_seed_gives_the_same_json_and_another_seed_differs(tmp_path):
    a, b, c = _sim_json(tmp_path, 1, "a.json"), _sim_json(tmp_path, 1, "b.json"), _sim_json(tmp_path, 2, "c.json")
    assert a == b and a != c
    m = json.loads(a)
    assert m["completed"] == 40 and m["output_throughput"] > 0 and m["p99_itl_ms"] >= m["median_itl_ms"]


def test_a_fit_recovers_a_known_cost_model():
    truth = CostModel(floor=0.02, prompt_row=0.0015, decode_row=0.003, sampled_row=0.0005, attn_per_1k=0.0001)
    rows = []
    for p, d, smp, pairs in [
        (0, 1, 1, 257),
        (0, 4, 4, 1028),
        (0, 16, 16, 4112),
        (64, 4, 4, 14000),
        (64, 16, 16, 17000),
        (256, 0, 1, 32896),
        (512, 0, 1, 131328),
        (0, 64, 64, 16448),
    ]:
        ms = 1000 * (
            truth.floor
            + truth.prompt_row * p
            + truth.decode_row * d
            + truth.sampled_row * smp
            + truth.attn_per_1k * pairs / 1000
        )
        rows.append({"kind": "x", "n": 0, "prompt_rows": p, "decode_rows": d, "sampled": smp, "pairs": pairs, "ms": ms})
    got, errors = fit(rows, None, "test")
    assert max(abs(e["error_pct"]) for e in errors) < 1e-6
    assert got.floor == pytest.approx(truth.floor) and got.prompt_row == pytest.approx(truth.prompt_row)


def test_every_preset_names_its_source():
    for name in ("gemma4-12b-sm89", "moe-26b-a4b-like", "local", "zen3-measured", "zen5-measured", "amx-measured"):
        assert load_preset(name).source


def test_a_lane_flight_joined_for_a_live_rows_page_finishes_every_request_whole(tmp_path):
    """Issue 36's bug 1, its own command: a live row short of a page joined the lane's flight, whose
    request then entered the roster after the rows had their pages and decoded past its page table
    (`KV frontier N+1 passed its reservation N` on the simulator, every request failed)."""
    out = tmp_path / "bug1.json"
    assert (
        main(
            [
                "sim",
                "--cost",
                "local",
                "--max-context",
                "2048",
                "--decode-slots",
                "8",
                "--async-prefill",
                "cpu:1",
                "--kv-cache-mb",
                "190",
                "--mix-chunk-tokens",
                "off",
                "--num-prompts",
                "48",
                "--random-input-len",
                "400",
                "--random-output-len",
                "300",
                "--random-range-ratio",
                "0.9",
                "--max-concurrency",
                "8",
                "--seed",
                "3",
                "--jitter",
                "0.1",
                "--save-result",
                str(out),
            ]
        )
        == 0
    )
    m = json.loads(out.read_text())
    assert m["completed"] == 48 and m["failed"] == 0 and m["preemptions"] > 0


def test_equal_arrivals_with_a_lane_flight_and_short_pages_all_finish_whole():
    """The same root with every request arriving at once (24 at t=0 into 8 slots, a 190 MiB budget,
    the lane): failed as bug 1 before the fix (`KV frontier 353 passed its reservation 352`)."""
    jobs = sim.workload(24, 300, 300, 0.9, 0)
    res, s = sim.simulate(
        cfg(DECODE_SLOTS="8", MAX_CONTEXT="2048", KV_CACHE_MB="190", ASYNC_PREFILL="cpu:1", MIX_CHUNK_TOKENS="off"),
        load_preset("local"),
        jobs,
        concurrency=24,
        offsets=[0.0] * 24,
        seed=0,
        jitter=0.1,
    )
    assert s["preemptions"] > 0
    assert all(r.success and r.output_tokens == ol for r, (_, ol) in zip(res, jobs))


def test_no_request_is_preempted_more_than_max_preemptions_under_heavy_kv_thrash(tmp_path):
    """Issue 36's bug 4: the cap was a preference. This workload (16 long streams in a 160 MiB pool,
    walk off) preempted one request 7 times before the bound; now the MAX_PREEMPTIONS-th preemption
    readmits it with its whole length reserved, and nobody is preempted again."""
    from tailgate.engine.preemption import MAX_PREEMPTIONS

    out = tmp_path / "thrash.json"
    assert (
        main(
            [
                "sim",
                "--cost",
                "local",
                "--num-prompts",
                "60",
                "--seed",
                "5",
                "--jitter",
                "0.1",
                "--max-concurrency",
                "16",
                "--kv-cache-mb",
                "160",
                "--max-context",
                "512",
                "--decode-slots",
                "16",
                "--random-input-len",
                "50",
                "--random-output-len",
                "440",
                "--mix-chunk-tokens",
                "off",
                "--itl-target-ms",
                "off",
                "--save-result",
                str(out),
            ]
        )
        == 0
    )
    m = json.loads(out.read_text())
    assert m["completed"] == 60 and m["failed"] == 0 and m["preemptions"] > 60
    assert m["most_preempted"] == MAX_PREEMPTIONS  # reached, never passed


def test_a_kv_budget_preempts_under_the_simulator_and_every_request_still_finishes_whole():
    # 1 KiB a token, no sliding pool: 1 MiB holds 64 usable pages of 16 tokens; eight 200 + 120-token
    # requests need 20 pages each, so live rows cannot all grow and the latest arrivals go back.
    cost = CostModel(floor=0.010, prompt_row=0.001, decode_row=0.002, kv_token_bytes={"global": 1024, "local": 0})
    jobs = [(200, 120)] * 8
    res, s = sim.simulate(cfg(DECODE_SLOTS="8", MAX_CONTEXT="512", KV_CACHE_MB="1"), cost, jobs, concurrency=8)
    assert s["preemptions"] > 0 and s["kv_pages"]["global"] == 64
    assert all(r.success and r.output_tokens == 120 for r in res)
    _, free = sim.simulate(cfg(DECODE_SLOTS="8", MAX_CONTEXT="512"), cost, jobs, concurrency=8)
    assert free["preemptions"] == 0


def test_a_kv_budget_needs_the_cost_models_kv_sizes(capsys):
    assert main(["sim", "--cost", "gemma4-12b-sm89", "--num-prompts", "4", "--kv-cache-mb", "300"]) == 2
    assert "KV_CACHE_MB=300" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kv_token_bytes"):
        sim.build(cfg(KV_CACHE_MB="64"), SCRIPTED, sim.VirtualClock())


def test_a_simulation_runs_without_importing_torch():
    """`tailgate sim` builds the CLI's whole parser, yet must not pay torch's import (~1.2 s of a
    2.3 s start before the serve flags moved to `server/args.py`): a fresh interpreter runs one."""
    import subprocess
    import sys

    code = (
        "import sys; from tailgate.cli import main; "
        "rc = main(['sim', '--cost', 'gemma4-12b-sm89', '--num-prompts', '4', '--random-input-len', '64', "
        "'--random-output-len', '4']); print('torch' in sys.modules, rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False 0"
