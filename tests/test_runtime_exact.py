"""Self-differentials in fp32: batching, chunking and row order must not change the tokens."""

from __future__ import annotations

import torch

from tailgate.engine.pages import SeqPages
from tailgate.engine.plan import Segment
from tailgate.model.runtime import serial
from conftest import LONG_TEXT

PROMPTS = ["The capital of France is", "My favourite recipe for soup starts with", "In 1905, Einstein published"]


class Live:
    """A greedy sequence driven by hand through the runner."""

    def __init__(self, r, ids):
        self.r, self.ids, self.seq, self.out = r, ids, SeqPages(), []

    def prefill_segment(self):
        assert self.r.book.reserve(self.seq, len(self.ids))
        return Segment(self.ids, 0, self.seq)

    def decode_segment(self):
        assert self.r.book.reserve(self.seq, self.seq.frontier + 1)
        return Segment([self.out[-1]], self.seq.frontier, self.seq)


def run_step(r, lives_and_segments):
    segs = [s for _, s in lives_and_segments]
    logits = r.runner.step(segs)
    for (live, seg), row in zip(lives_and_segments, logits.argmax(-1).tolist()):
        r.book.advance(live.seq, len(seg.tokens))
        live.out.append(row)


def test_a_mixed_step_matches_serial_batch_one(rig):
    r = rig("gemma3-270m", "fp32")
    tok = r.model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    n = 12
    serial_out = [serial.generate(r.runner, r.book, x, n) for x in ids]
    a, b, c = (Live(r, x) for x in ids)
    run_step(r, [(a, a.prefill_segment())])
    run_step(r, [(b, b.prefill_segment()), (a, a.decode_segment())])  # b rides a's decode
    for _ in range(3):
        run_step(r, [(a, a.decode_segment()), (b, b.decode_segment())])
    # c's prompt rides the live batch: prompt rows first, then every live row.
    run_step(r, [(c, c.prefill_segment()), (a, a.decode_segment()), (b, b.decode_segment())])
    while min(len(x.out) for x in (a, b, c)) < n:
        run_step(r, [(x, x.decode_segment()) for x in (a, b, c) if len(x.out) < n])
    for live, ref in zip((a, b, c), serial_out):
        assert live.out[:n] == ref
        r.book.free(live.seq)
    r.assert_no_leak()


def test_a_prompt_prefilled_in_chunks_matches_whole(rig):
    r = rig("gemma3-270m", "fp32")
    ids = r.model.tokenizer.encode(LONG_TEXT * 10)[:576]  # crosses the 512-token sliding window
    whole = serial.teacher_forced_logits(r.runner, r.book, ids)
    chunked = serial.teacher_forced_logits(r.runner, r.book, ids, chunk=96)
    assert torch.equal(whole.argmax(-1), chunked.argmax(-1))
    assert (torch.log_softmax(whole, -1) - torch.log_softmax(chunked, -1)).abs().max() < 1e-3
    assert serial.generate(r.runner, r.book, ids, 8) == serial.generate(r.runner, r.book, ids, 8, chunk=128)
    r.assert_no_leak()


def test_a_ragged_batch_does_not_depend_on_row_order(rig):
    r = rig("gemma3-270m", "fp32")
    tok = r.model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS] + [tok.encode(LONG_TEXT)]
    results = []
    for order in (lambda xs: xs, lambda xs: xs[::-1]):
        lives = [Live(r, x) for x in ids]
        run_step(r, [(lives[0], lives[0].prefill_segment()), (lives[1], lives[1].prefill_segment())])
        for _ in range(4):
            batch = [
                (lives[0], lives[0].decode_segment()),
                (lives[1], lives[1].decode_segment()),
                (lives[2], lives[2].prefill_segment() if not lives[2].out else lives[2].decode_segment()),
                (lives[3], lives[3].prefill_segment() if not lives[3].out else lives[3].decode_segment()),
            ]
            run_step(r, order(batch))
        results.append([x.out for x in lives])
        for x in lives:
            r.book.free(x.seq)
    assert results[0] == results[1]
    r.assert_no_leak()


def test_llama_mixed_step_matches_serial(rig):
    r = rig("smollm2-135m", "fp32")
    tok = r.model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS[:2]]
    serial_out = [serial.generate(r.runner, r.book, x, 8) for x in ids]
    a, b = Live(r, ids[0]), Live(r, ids[1])
    run_step(r, [(a, a.prefill_segment())])
    run_step(r, [(b, b.prefill_segment()), (a, a.decode_segment())])
    while min(len(a.out), len(b.out)) < 8:
        run_step(r, [(x, x.decode_segment()) for x in (a, b) if len(x.out) < 8])
    assert [a.out[:8], b.out[:8]] == serial_out
    for x in (a, b):
        r.book.free(x.seq)
    r.assert_no_leak()
