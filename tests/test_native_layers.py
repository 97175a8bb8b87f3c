"""A step's layers in one native call (runtime/native_layers.py, csrc/layers.c): the same logits,
bit for bit, as the Python layer loop, for decode rows and prompt chunks, on every Llama-shaped
family and plan it takes; the steps and models it cannot take run the loop."""

from __future__ import annotations

import pytest
import torch

import families_tiny
from tailgate.engine.pages import KVBook, SeqPages, pool_pages
from tailgate.engine.plan import Segment
from tailgate.model.formats.weights import load_model
from tailgate.model.kernels import native
from tailgate.model.kernels.choice import EVERY, choose
from tailgate.model.runtime import native_layers
from tailgate.model.runtime.runner import ModelRunner

_LIB, _WHY = native.load()
pytestmark = pytest.mark.skipif(_LIB is None, reason=f"{_WHY}: no native kernels here")


@pytest.fixture(scope="module")
def model(loaded, tmp_path_factory):
    """name -> a loaded model: the shipped Gemma 3 270M and SmolLM2-135M (GGUF), or a tiny random
    family checkpoint (Mistral's window is 12 tokens: the 40-token row crosses it)."""
    root = tmp_path_factory.mktemp("native_layers")
    tok = None
    built = {}

    def get(name):
        nonlocal tok
        if name in ("smollm2-135m", "gemma3-270m"):
            return loaded(name)
        if name not in built:
            if tok is None:
                loaded("smollm2-135m").tokenizer._tok.save(str(root / "smollm2.json"))
                tok = families_tiny.tiny_tokenizer(root / "smollm2.json", root / "tokenizer.json")
            built[name] = load_model(str(families_tiny.build(root / name, name, tok)), log=lambda _: None)
        return built[name]

    return get


def _runner_and_rows(m, lengths, plan=None, room=4):
    """A runner on `plan` (default the CPU's own), and one sequence per length with its prompt
    prefilled (and pages for `room` more rows)."""
    pages = pool_pages(256, len(lengths) + 2, m.spec.sliding_window, transient_prompts=2)
    runner = ModelRunner(m.spec, m.weights, pages, plan=plan or choose("auto", "auto", "cpu"))
    runner.book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    seqs = []
    for i, n in enumerate(lengths):
        seq = SeqPages()
        runner.book.reserve(seq, n + room)
        runner.step([Segment([(7 * i + j) % 200 + 3 for j in range(n)], 0, seq)])
        seq.frontier = n
        seqs.append(seq)
    return runner, seqs


def _step(runner, segments, on: bool) -> torch.Tensor:
    native_layers.ENABLED = on
    try:
        return runner.step(segments)
    finally:
        native_layers.ENABLED = True


def _decode(runner, seqs, on: bool) -> torch.Tensor:
    return _step(runner, [Segment([11 + i], s.frontier, s) for i, s in enumerate(seqs)], on)


def _both_ways(runner, segments) -> dict:
    """The step run through the one call ("call") and through the loop ("loop"), each from the
    same KV pools (so the loop's writes cannot stand in for writes the call skipped): per way its
    logits, the pools after it and how many native calls it made."""
    kv = runner.kv
    before = {f: (kv.k[f].clone(), kv.v[f].clone()) for f in kv.k}
    calls, out = [], {}
    real = native._LIB.step_layers
    native._LIB.step_layers = lambda *a: calls.append(a) or real(*a)
    try:
        for way in ("call", "loop"):
            for f, (k, v) in before.items():
                kv.k[f].copy_(k)
                kv.v[f].copy_(v)
            n = len(calls)
            logits = _step(runner, segments, way == "call")
            out[way] = (logits, {f: (kv.k[f].clone(), kv.v[f].clone()) for f in kv.k}, len(calls) - n)
    finally:
        native._LIB.step_layers = real
    return out


def _assert_same(runner, segments) -> torch.Tensor:
    ways = _both_ways(runner, segments)
    (logits, pools, calls), (loop_logits, loop_pools, loop_calls) = ways["call"], ways["loop"]
    assert (calls, loop_calls) == (1, 0)  # the call ran, and only in its way
    assert torch.equal(logits, loop_logits)
    for f in pools:  # every K/V row the step wrote, in the slots the loop wrote it to
        assert torch.equal(pools[f][0], loop_pools[f][0]) and torch.equal(pools[f][1], loop_pools[f][1])
    return logits


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "llama3", "qwen3", "mistral"])
@pytest.mark.parametrize("lengths", [(9,), (40, 5, 17)])
def test_a_decode_step_gives_the_same_logits_with_its_layers_in_one_native_call(model, name, lengths):
    runner, seqs = _runner_and_rows(model(name), lengths)
    _assert_same_logits(runner, seqs)


@pytest.mark.parametrize("name", ["gemma3-270m", "qwen3"])
def test_the_one_call_at_the_attentions_8_lane_width_gives_the_loops_logits(model, name, monkeypatch):
    """AVX2 CPUs (and head dims that 16 does not divide) attend at 8 lanes: both ways take it."""
    monkeypatch.setattr(native, "attention_lanes", lambda cpu=None: 8)
    runner, seqs = _runner_and_rows(model(name), (33, 6))
    _assert_same_logits(runner, seqs)


def _assert_same_logits(runner, seqs):
    if runner.plan.attention != "native":
        pytest.skip(f"this plan runs torch's ops: {runner.plan.line()}")
    _assert_same(runner, [Segment([11 + i], s.frontier, s) for i, s in enumerate(seqs)])


def test_a_model_whose_layers_the_native_call_cannot_run_keeps_the_python_loop(model):
    """Qwen2's q/k/v carry biases (a kernel of their own): no layer table, and it decodes as before."""
    runner, seqs = _runner_and_rows(model("qwen2"), (12, 3))
    ways = _both_ways(runner, [Segment([11 + i], s.frontier, s) for i, s in enumerate(seqs)])
    assert ways["call"][2] == ways["loop"][2] == 0
    assert torch.equal(ways["call"][0], ways["loop"][0])


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "llama3", "qwen3", "mistral"])
@pytest.mark.parametrize("decoding", [True, False])
def test_a_walk_round_gives_the_same_logits_with_its_layers_in_one_native_call(model, name, decoding):
    """A walk round's rows: a fresh prompt (its keys its own rows), a prompt's next chunk (its keys
    in the pool before it; past Mistral's 12-token window, so the window cuts them), and with
    `decoding` live rows beside them; the round's prompt rows attend through the native prompt
    kernel as the loop's do."""
    runner, seqs = _runner_and_rows(model(name), (9, 40, 17), room=24)
    if not runner.native_prompts:
        pytest.skip(f"this plan runs torch's ops for prompts: {runner.plan.line()}")
    fresh = SeqPages()
    runner.book.reserve(fresh, 30)
    chunk = seqs[1]
    segs = [Segment([20 + j for j in range(23)], 0, fresh), Segment([50 + j for j in range(6)], 40, chunk)]
    if decoding:
        segs += [Segment([11 + i], s.frontier, s) for i, s in enumerate((seqs[0], seqs[2]))]
    assert _assert_same(runner, segs).shape[0] == 2 + 2 * decoding  # each prompt's last row, each live row


def test_a_row_cut_moved_after_the_first_steps_moves_which_steps_take_the_native_call(model):
    """The start-up probe moves the layers' q8 cut (probe.apply_layer_cut) after the warm-up's
    steps: a step over the cut runs the dense kernel in the loop, never the panels a table built
    before the move pointed at."""
    from tailgate.model.kernels.probe import apply_layer_cut

    runner, seqs = _runner_and_rows(model("llama3"), (5, 9, 14), plan=choose("fp32", "q8", "cpu"))
    if runner.plan.attention != "native" or runner.plan.quant != "q8":
        pytest.skip(f"no q8 plan with native ops here: {runner.plan.line()}")
    if runner.plan.quant_rows[0] >= EVERY:  # AVX2's q8 plan: no dense copy kept, so no cut to move
        pytest.skip(f"the layers' panels take every call here: {runner.plan.line()}")
    calls = []
    real = native._LIB.step_layers
    try:
        native._LIB.step_layers = lambda *a: calls.append(a) or real(*a)
        for cut, native_call in ((8, True), (2, False), (8, True)):
            apply_layer_cut(runner.w, cut)
            before = len(calls)
            ours = _decode(runner, seqs, True)
            assert (len(calls) > before) == native_call
            assert torch.equal(ours, _decode(runner, seqs, False))
    finally:
        native._LIB.step_layers = real


def test_a_step_past_max_rows_keeps_the_python_loop(model, monkeypatch):
    """The call holds a layer's every scratch activation at once: a long prefill keeps the loop."""
    runner, seqs = _runner_and_rows(model("llama3"), (6,), room=24)
    if not runner.native_prompts:
        pytest.skip(f"this plan runs torch's ops for prompts: {runner.plan.line()}")
    monkeypatch.setattr(native_layers, "MAX_ROWS", 8)
    calls = []
    real = native._LIB.step_layers
    monkeypatch.setattr(native._LIB, "step_layers", lambda *a: calls.append(a) or real(*a))
    seq = seqs[0]
    runner.step([Segment([20 + j for j in range(8)], 6, seq)])  # 8 rows: the call
    assert len(calls) == 1
    runner.step([Segment([30 + j for j in range(9)], 14, seq)])  # 9 rows: the loop
    assert len(calls) == 1
