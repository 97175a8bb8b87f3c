"""Incremental detokenization releases exactly the text a full decode gives, stop strings aside."""

from __future__ import annotations

import random

import pytest

from tailgate.model.formats.weights import load_tokenizer
from tailgate.server.text import TextStream

TEXTS = ["Héllo wörld — 日本語のテキスト 🙂🙂 and code: def f(x):\n    return x**2  ", "  leading spaces\n\nnew  lines"]


@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_the_incremental_text_equals_a_full_decode(name):
    tok = load_tokenizer(name)
    rng = random.Random(0)
    seqs = [tok.encode(t, add_bos=False) for t in TEXTS] + [[rng.randrange(49152) for _ in range(60)] for _ in range(5)]
    for ids in seqs:
        for skip in (True, False):
            ts = TextStream(tok, [], skip)
            pieces = [ts.push(t) for t in ids]
            assert "".join(pieces) + ts.flush() == tok.decode(ids, skip_special=skip)
            assert not any("\ufffd" in p and "\ufffd" not in tok.decode(ids, skip_special=skip) for p in pieces)


def test_a_stop_string_split_across_tokens_is_held_back_then_cut():
    tok = load_tokenizer("gemma3-270m")
    ids = tok.encode("The answer is 42. END of story", add_bos=False)
    ts = TextStream(tok, ["END"])
    out = "".join(ts.push(t) for t in ids) + ts.flush()
    assert out == "The answer is 42. " and ts.stopped and ts.final_text == out
