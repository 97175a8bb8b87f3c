"""Sampling: filters are exact, seeds reproduce, greedy is argmax."""

from __future__ import annotations

import pytest
import torch

from tailgate.model.runtime.sampler import SamplingParams, apply_penalties, filter_logits, make_generator, sample


def test_greedy_rows_take_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]])
    assert sample(logits, [SamplingParams(), SamplingParams(temperature=1.0, top_k=1)], [None, None]) == [1, 0]


def test_greedy_rows_take_torchs_argmax_through_the_native_kernel_where_the_plan_runs_ours(monkeypatch):
    """`native=True` (the plan runs our kernels) reads csrc/argmax.c, with torch's answer; without
    it torch answers and the kernel is not asked (it is AVX2 code: CPUs without AVX2 must not run it)."""
    from tailgate.model.kernels import native
    from tailgate.model.runtime import sampler

    logits = torch.randn(5, 70000, generator=torch.Generator().manual_seed(3))
    logits[:, 40000] = logits[:, 9] = 8.0  # a tie: the first index
    want = logits.argmax(-1).tolist()
    asked = []
    monkeypatch.setattr(sampler, "argmax_rows", lambda x: asked.append(x) or native.argmax_rows(x))
    assert sample(logits, [SamplingParams()] * 5, [None] * 5) == want
    assert not asked
    assert sample(logits, [SamplingParams()] * 5, [None] * 5, native=True) == want
    assert len(asked) == 1


def test_the_same_seed_draws_the_same_tokens():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0, seed=7)
    draw = lambda: [sample(logits, [p], [g])[0] for g in [make_generator(7)] for _ in range(20)]  # noqa: E731
    a, b = draw(), draw()
    assert a == b and len(set(a)) > 1


def test_top_k_top_p_and_min_p_keep_exactly_the_expected_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    kept = lambda p: torch.isfinite(filter_logits(logits, [p]))[0].tolist()  # noqa: E731
    assert kept(SamplingParams(temperature=1.0, top_k=2)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.7)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.75)) == [True, True, False, False]
    assert kept(SamplingParams(temperature=1.0, top_p=0.76)) == [True, True, True, False]
    assert kept(SamplingParams(temperature=1.0, min_p=0.3)) == [True, True, True, False]


def test_a_top_p_that_rounds_to_zero_keeps_the_top_token():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))  # 5e-324 is a valid top_p and 0.0 in fp32
    assert torch.isfinite(filter_logits(logits, [SamplingParams(temperature=1.0, top_p=5e-324)]))[0].tolist() == [
        False,
        True,
        False,
    ]
    assert sample(logits, [SamplingParams(temperature=1.0, top_p=5e-324)], [make_generator(0)]) == [1]


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log()[None, :]
    g = make_generator(123)
    p = SamplingParams(temperature=1.0)
    counts = torch.bincount(torch.tensor([sample(logits, [p], [g])[0] for _ in range(3000)]), minlength=3)
    freq = counts.float() / 3000
    assert (freq - probs).abs().max() < 0.03


# ---- penalties and min_tokens against vLLM's formulas -----------------------------------------
# vLLM (model_executor/layers/utils.py apply_penalties; v1 sample/ops/penalties.py), in this order:
#   1. repetition: every id seen in the prompt OR the output: logit / r if logit > 0, else logit * r
#   2. frequency:  logit -= f * (count of the id in the output)
#   3. presence:   logit -= p * (1 if the id is in the output else 0)
# and min_tokens masks the EOS and stop_token_ids to -inf while fewer than min_tokens were generated.
# Every expected value below is worked by hand from those rules, not from our code.
LOGITS = [2.0, -1.0, 0.5, -0.5, 3.0, 1.0]
PROMPT, OUTPUT = [0, 1], [2, 2, 3]  # ids 0, 1 in the prompt only; 2 twice and 3 once in the output; 4, 5 unseen


@pytest.mark.parametrize(
    "knobs,want",
    [
        # repetition 2 over prompt + output: 2/2, -1*2, 0.5/2, -0.5*2; unseen ids untouched
        (dict(repetition_penalty=2.0), [1.0, -2.0, 0.25, -1.0, 3.0, 1.0]),
        # frequency 0.5 over the output only: id 2 (twice) -1.0, id 3 (once) -0.5; the prompt's ids untouched
        (dict(frequency_penalty=0.5), [2.0, -1.0, -0.5, -1.0, 3.0, 1.0]),
        # presence 0.25 over the output only: ids 2 and 3 once each, whatever their count
        (dict(presence_penalty=0.25), [2.0, -1.0, 0.25, -0.75, 3.0, 1.0]),
        # negative frequency / presence reward instead (OpenAI's range is -2..2)
        (dict(frequency_penalty=-1.0, presence_penalty=-0.5), [2.0, -1.0, 3.0, 1.0, 3.0, 1.0]),
        # all three, repetition first: id 2: 0.5/2 - 0.5*2 - 0.25 = -1.0 (frequency and presence first
        # would give (0.5 - 1.25) * 2 = -1.5); id 3: -0.5*2 - 0.5 - 0.25 = -1.75
        (
            dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
            [1.0, -2.0, -1.0, -1.75, 3.0, 1.0],
        ),
        # a repetition penalty below 1 rewards instead: 2/0.5, -1*0.5, 0.5/0.5, -0.5*0.5
        (dict(repetition_penalty=0.5), [4.0, -0.5, 1.0, -0.25, 3.0, 1.0]),
    ],
)
def test_penalties_follow_vllms_formulas_on_hand_built_logits(knobs, want):
    got = apply_penalties(torch.tensor(LOGITS), SamplingParams(**knobs), PROMPT, OUTPUT)
    assert got.tolist() == want  # every operand and result is exact in binary


def test_presence_and_frequency_need_an_output_and_repetition_reads_the_prompt_alone():
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    assert apply_penalties(torch.tensor(LOGITS), p, PROMPT, []).tolist() == [1.0, -2.0, 0.5, -0.5, 3.0, 1.0]


class ConstantRunner:
    """A runner whose every sampled row has the same hand-built logits."""

    def __init__(self, logits):
        self.logits = torch.tensor(logits)

    def step(self, segments):
        return self.logits.repeat(sum(1 for s in segments if s.sample), 1)


def run_engine(logits, reqs):
    """The scheduler and the real executor over ConstantRunner: {request: (tokens, logprob events, finish)}."""
    from tailgate.config import ServingConfig
    from tailgate.engine.pages import KVBook
    from tailgate.engine.request import Finished, Token
    from tailgate.engine.scheduler import Scheduler
    from tailgate.model.runtime.executor import ModelExecutor

    cfg = ServingConfig(max_context=256, decode_slots=4, mix_gather_rows=512, mix_max_prompts=4)
    s = Scheduler(ModelExecutor(ConstantRunner(logits)), KVBook(65, None, None), cfg, len(logits), clock=lambda: 0.0)
    for r in reqs:
        s.submit(r)
    events = []
    while s.has_work():
        events += s.step(0.0)
    out = {}
    for r in reqs:
        toks = [e for e in events if isinstance(e, Token) and e.request_id == r.id]
        fin = [e.reason for e in events if isinstance(e, Finished) and e.request_id == r.id]
        out[r.id] = [e.token for e in toks], toks, fin
    return out


def test_min_tokens_masks_eos_and_stop_ids_until_that_many_tokens_then_lets_them_end_it():
    from tailgate.engine.request import Request

    logits = [0.0, 1.0, 2.0, 3.0, 0.5, 4.0, 3.5]  # ids 5 and 6 lead; then 3
    eos = Request([1], max_tokens=10, eos_ids=frozenset({5}), min_tokens=3)
    stop = Request([1], max_tokens=10, stop_token_ids=frozenset({5}), min_tokens=2)
    # EOS and the stop id masked together (the stop id outranks 3 even with EOS masked)
    both = Request([1], max_tokens=10, eos_ids=frozenset({5}), stop_token_ids=frozenset({6}), min_tokens=1)
    ignore = Request([1], max_tokens=2, eos_ids=frozenset({5}), ignore_eos=True, min_tokens=1)
    none = Request([1], max_tokens=10, eos_ids=frozenset({5}))
    got = run_engine(logits, [eos, stop, both, ignore, none])
    assert got[eos.id][0] == [6, 6, 6] and got[eos.id][2] == ["stop"]  # only EOS masked: 6 is next
    assert got[stop.id][0] == [6, 6] and got[stop.id][2] == ["stop"]  # a stop id is masked as EOS is
    assert got[both.id][0] == [3] and got[both.id][2] == ["stop"]
    # ignore_eos: EOS is neither masked nor an end, so it is emitted
    assert got[ignore.id][0] == [5, 5] and got[ignore.id][2] == ["length"]
    assert got[none.id][0] == [] and got[none.id][2] == ["stop"]


def test_the_engine_penalises_with_the_prompt_and_the_output_so_far():
    from tailgate.engine.request import Request

    # repetition 2, frequency 0.5, presence 0.5; prompt [2]; EOS 5 masked for 3 tokens. By hand:
    #  step 1, output []:      id 2 (prompt) 3.5/2 = 1.75; argmax of [0, 2.5, 1.75, 3.0, -1, -inf] -> 3
    #  step 2, output [3]:     id 3 3.0/2 - 0.5 - 0.5 = 0.5; [0, 2.5, 1.75, 0.5, -1] -> 1
    #  step 3, output [3,1]:   id 1 2.5/2 - 1 = 0.25; [0, 0.25, 1.75, 0.5, -1] -> 2
    #  step 4, output [3,1,2]: EOS unmasked and never seen: 4.0 -> stop
    # Without the prompt in the repetition set step 1 picks 2; without the output history step 2 picks 3.
    logits = [0.0, 2.5, 3.5, 3.0, -1.0, 4.0]
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.5)
    r = Request([2], max_tokens=10, params=p, eos_ids=frozenset({5}), min_tokens=3, logprobs=2)
    toks, events, fin = run_engine(logits, [r])[r.id]
    assert toks == [3, 1, 2] and fin == ["stop"]
    # Logprobs are the step's raw distribution, before penalties and the mask (vLLM's default
    # logprobs_mode="raw_logprobs"): log_softmax of the hand-built logits.
    lsm = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).tolist()
    for e in events:
        assert e.logprob == pytest.approx(lsm[e.token], abs=1e-6)
        assert [t for t, _ in e.top_logprobs] == [5, 2]
        assert [v for _, v in e.top_logprobs] == pytest.approx([lsm[5], lsm[2]], abs=1e-6)
