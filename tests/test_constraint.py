"""The grammar mask and logit_bias at the sampler, on SmolLM2's real tokenizer (llguidance's
vocabulary of it built once per session): random logits stand in for the model, so a bug in the
mask (a wrong bit order, a missed row, a grammar that moves too early) shows as an invalid answer."""

from __future__ import annotations

import json
import re

import jsonschema
import jsonschema_rs
import numpy as np
import pytest
import torch

from tailgate.engine.request import RowSample, SamplingParams
from tailgate.model.constraint import GrammarError, book_for
from tailgate.model.runtime.executor import ModelExecutor
from tailgate.model.formats.weights import load_tokenizer
from tailgate.server.protocol import ApiError
from tailgate.server.structured import JSON_OPTIONS, _vocab_bytes, check_writable, unwritable

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "color", "tags", "home"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "home": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 10}, "floor": {"type": "integer"}},
        },
    },
}


@pytest.fixture(scope="module")
def smol():
    tok = load_tokenizer("smollm2-135m")
    book_for(tok).tokenizer  # noqa: B018  (built once here: 1-3 s)
    return tok


def schema_grammar(tok, schema):
    from llguidance import LLMatcher

    return book_for(tok).compile(LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS), "the JSON schema")


def draw(ex, rows, logits_of, limit=300):
    """Sample every row until it ends (its grammar complete, or EOS); the tokens per row."""
    out = {r.request_id: [] for r in rows}
    live = list(rows)
    for _ in range(limit):
        if not live:
            break
        got = ex._sample_isolated(logits_of(len(live)), live)
        for r, s in zip(list(live), got):
            assert not isinstance(s, Exception), s
            if s.token in (2,):  # SmolLM2's EOS: the grammar allowed the end
                live.remove(r)
                continue
            out[r.request_id].append(s.token)
            if s.done:
                live.remove(r)
    assert not live, "a row never finished"
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tokens_drawn_at_temperature_1_under_a_schema_mask_always_spell_a_valid_document(smol, seed):
    ex = ModelExecutor(runner=None)
    g = schema_grammar(smol, SCHEMA)
    noise = torch.Generator().manual_seed(100 + seed)
    rows = [RowSample(f"r{seed}", SamplingParams(temperature=1.0, seed=seed, grammar=g))]
    toks = draw(ex, rows, lambda n: torch.randn(n, smol.vocab_size, generator=noise) * 4)
    doc = json.loads(smol.decode(toks[f"r{seed}"]))
    jsonschema.validate(doc, SCHEMA)
    ex.release(f"r{seed}")
    assert not ex._constraints


def test_an_unconstrained_row_beside_a_constrained_one_draws_what_it_draws_alone(smol):
    noise = torch.Generator().manual_seed(7)
    steps = [torch.randn(2, smol.vocab_size, generator=noise) for _ in range(20)]
    free = SamplingParams(temperature=1.0, seed=11)
    alone, beside = ModelExecutor(runner=None), ModelExecutor(runner=None)
    g = schema_grammar(smol, {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    a = [alone._sample_isolated(x[1:], [RowSample("free", free)])[0].token for x in steps]
    b = [
        beside._sample_isolated(
            x, [RowSample("c", SamplingParams(temperature=1.0, seed=3, grammar=g)), RowSample("free", free)]
        )[1].token
        for x in steps[:5]
    ]
    assert a[:5] == b


def test_a_choice_grammar_ends_its_row_on_the_last_token_of_a_choice(smol):
    from llguidance import LLMatcher

    g = book_for(smol).compile(LLMatcher.grammar_from_lark('start: "positive" | "negative"'), "choice")
    ex = ModelExecutor(runner=None)
    toks = draw(
        ex,
        [RowSample("c", SamplingParams(temperature=1.0, seed=5, grammar=g))],
        lambda n: torch.randn(n, smol.vocab_size),
    )
    assert smol.decode(toks["c"]) in ("positive", "negative")


def test_greedy_rows_follow_the_mask_too(smol):
    g = schema_grammar(smol, {"enum": ["yes", "no"]})
    ex = ModelExecutor(runner=None)
    toks = draw(
        ex,
        [RowSample("g", SamplingParams(temperature=0.0, grammar=g))],
        lambda n: torch.randn(n, smol.vocab_size, generator=torch.Generator().manual_seed(1)),
    )
    assert smol.decode(toks["g"]) in ('"yes"', '"no"')


def test_logit_bias_of_100_forces_a_token_and_minus_100_bans_the_argmax(smol):
    x = torch.randn(1, smol.vocab_size, generator=torch.Generator().manual_seed(2))
    top = int(x.argmax())
    ex = ModelExecutor(runner=None)
    forced = ex._sample_isolated(
        x, [RowSample("f", SamplingParams(temperature=1.0, seed=1, logit_bias=((42, 100.0),)))]
    )
    assert forced[0].token == 42
    banned = ex._sample_isolated(x, [RowSample("b", SamplingParams(logit_bias=((top, -100.0),)))])
    assert banned[0].token != top
    # the reported logprob is the model's own, before the bias (vLLM's raw_logprobs)
    lp = ex._sample_isolated(x, [RowSample("l", SamplingParams(logit_bias=((42, 100.0),)), logprobs=0)])[0]
    assert lp.token == 42 and lp.logprob == pytest.approx(float(torch.log_softmax(x[0], -1)[42]), abs=1e-5)


@pytest.mark.parametrize(
    "keyword,schema",
    [
        ("not", {"not": {"type": "integer"}}),
        ("uniqueItems", {"type": "array", "uniqueItems": True}),
        ("if", {"if": {"type": "integer"}, "then": {"minimum": 1}}),
    ],
)
def test_a_schema_keyword_the_engine_cannot_enforce_is_refused_by_name(smol, keyword, schema):
    with pytest.raises(GrammarError, match=keyword):
        schema_grammar(smol, schema)


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        },
    },
}


@pytest.mark.parametrize("family", ["hermes", "llama3", "gemma", "smollm2", "mistral"])
def test_each_family_reads_back_its_own_call_text_and_its_forced_grammar_accepts_it(smol, family):
    from tailgate.server.tool_formats import FORMATS

    fmt = next(f for f in FORMATS if f.name == family)
    calls = [
        {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
    ]
    text = fmt.render(calls)
    assert fmt.parse(text) == ("", calls)
    assert fmt.parse("Sure: " + text) in (("Sure:", calls), None)  # Llama 3 calls are the whole answer
    for parallel, shown in ((True, calls), (False, calls[:1])):
        c = book_for(smol).compile(fmt.grammar([TOOL], None, parallel), "tools").start()
        assert c.matcher.consume_tokens(smol.encode(fmt.render(shown), add_bos=False)), c.matcher.get_error()
        assert c.matcher.is_accepting()
    bad = fmt.render([{"name": "get_weather", "arguments": {"city": "Paris", "days": 9}}])  # past maximum
    c = book_for(smol).compile(fmt.grammar([TOOL], "get_weather", False), "tools").start()
    assert not c.matcher.consume_tokens(smol.encode(bad, add_bos=False)) or not c.matcher.is_accepting()


def test_on_the_real_model_a_constrained_stream_ends_stop_on_its_last_token_beside_an_unchanged_neighbour(loaded):
    """The engine's path: SmolLM2 decoding a constrained and a free request together (the masks
    then come from the worker during the forward pass); the free one's greedy tokens equal its
    tokens alone, the constrained one validates and ends `stop` without emitting an EOS."""
    from harness import Harness
    from tailgate.engine.request import Finished

    m = loaded("smollm2-135m")
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["city", "days"],
        "properties": {
            "city": {"type": "string", "maxLength": 8},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
    }
    g = schema_grammar(m.tokenizer, schema)
    prompt = m.tokenizer.encode("The forecast for the next days in Paris:")
    with Harness(m, dtype="fp32", DECODE_SLOTS="2") as h:
        alone = h.submit(prompt, max_tokens=16)
        assert h.wait(lambda: h.done(alone))
        free = h.submit(prompt, max_tokens=16)
        shaped = h.submit(
            prompt,
            max_tokens=40,
            params=SamplingParams(temperature=1.0, seed=3, grammar=g),
            eos_ids=frozenset(m.tokenizer.eos_ids),
        )
        assert h.wait(lambda: h.done(free) and h.done(shaped))
        assert h.tokens(free) == h.tokens(alone)
        assert [e.reason for e in h.of(shaped, Finished)] == ["stop"]
        toks = h.tokens(shaped)
        assert not set(toks) & set(m.tokenizer.eos_ids)
        jsonschema.validate(json.loads(m.tokenizer.decode(toks)), schema)
    assert not h.engine.scheduler.executor._constraints  # released with the request


def walk_choice(tok, choice: str) -> bool:
    """Follow the masks (the first allowed token each step) to the choice's end; False when the
    mask lets through a token the grammar then refuses, or allows nothing."""
    from tailgate.server.structured import choice_grammar

    c = book_for(tok).compile(choice_grammar([choice], "guided_choice"), "the choices").start()
    row = torch.zeros((book_for(tok).vocab_size + 31) // 32, dtype=torch.int32)
    for _ in range(4 * len(choice.encode()) + 2):
        c.fill(row)
        bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
        allowed = np.flatnonzero(bits)
        if not len(allowed) or not c.matcher.consume_token(int(allowed[0])):
            return False
        if c.matcher.is_stopped():
            return True
    return False


@pytest.mark.parametrize(
    "choice,writable",
    [
        ("\U0005a8dc", False),
        ("CI\U000fdbb9\U0005a8dc", False),
        ("a\x04b", False),
        ("\U000b0000", False),
        ("\U0001f600\U000fdbb9", True),
        ("\u00f1\u009a", True),
        ("x", True),
        ("\U0003ffff\U000c0000", True),
    ],
)
def test_a_choice_is_declared_and_served_exactly_when_the_model_can_write_it(smol, choice, writable):
    """SmolLM2's vocabulary holds no 0x04 or 0xF1 byte, so no answer of it holds U+0004 or U+5A8DC;
    llguidance's mask then let a token through that broke the grammar (a 500). The schema's pattern
    (what /openapi.json puts on each choice) and the server's 400 say so, and every choice they
    admit is one the masks can finish."""
    pattern = unwritable(smol)
    lt = book_for(smol).tokenizer  # llguidance's own reading of the vocabulary agrees on the bytes
    assert _vocab_bytes(smol) == {b for i in range(smol.vocab_size) for b in lt.decode_bytes([i])}
    assert jsonschema_rs.validator_for({"type": "string", "pattern": pattern}).is_valid(choice) == writable
    assert bool(re.search(pattern, choice)) == writable
    if writable:
        assert walk_choice(smol, choice)
        check_writable({"guided_choice": [choice]}, smol)
    else:
        assert not walk_choice(smol, choice)
        with pytest.raises(ApiError) as e:
            check_writable({"structured_outputs": {"choice": ["ok", choice]}}, smol)
        assert e.value.status == 400 and "cannot write" in str(e.value.body())


@pytest.mark.parametrize("family", ["hermes", "gemma", "smollm2", "mistral", "llama3"])
def test_auto_tool_grammar_takes_text_or_valid_calls_and_no_broken_call(smol, family):
    """tool_choice "auto" (issue 37): free text, text then calls, or calls alone pass; once the
    opener is written, a half-formed call or arguments the schema refuses cannot be. Llama 3's
    calls are the whole answer, so text that merely holds one is text there."""
    from tailgate.server.tool_formats import FORMATS

    fmt = next(f for f in FORMATS if f.name == family)
    g = book_for(smol).compile(fmt.auto_grammar([TOOL], True), "auto tools")

    def whole(text: str) -> bool:
        c = g.start()
        return bool(c.matcher.consume_tokens(smol.encode(text, add_bos=False))) and c.matcher.is_accepting()

    call = fmt.render([{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}])
    assert whole("It is sunny, I think.") and whole(call)
    assert whole("Let me check. " + call)  # text, then the call (Llama 3: all of it text)
    assert not whole(fmt.render([{"name": "get_weather", "arguments": {"city": "Paris", "days": 9}}]))
    if fmt.opener:
        assert not whole("Sure " + call[: len(call) // 2])  # an opener starts a call that must finish
        assert not whole(fmt.opener + " not a call")
