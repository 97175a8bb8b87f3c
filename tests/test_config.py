"""The knob table: one resolve, an injectable lookup, refusals that name knob, value, grammar."""

from __future__ import annotations

import re

import pytest

from tailgate.config import KnobError, ServingConfig, env_lookup, parse_mix_chunk_tokens, resolve


def table(**overrides):
    return lambda name: overrides.get(name)


def test_defaults_resolve_without_any_knob():
    cfg = resolve(table())
    # the 64-row walk, no inter-token target (issue 42: `auto` judged at the client), widened under a
    # backlog by its 500 ms TTFT horizon
    assert cfg == ServingConfig(None, 16, 512, 4, 64, None, None, None, "auto", itl_target_ms=None, ttft_target_ms=500)
    assert cfg.with_model_limit(32768).max_context == 4096
    assert cfg.with_model_limit(2048).max_context == 2048


def test_knobs_parse_into_the_config():
    cfg = resolve(
        table(
            MAX_CONTEXT="2048", DECODE_SLOTS="64", MIX_GATHER_ROWS="256", MIX_MAX_PROMPTS="8", ADMIT_COALESCE_MS="300"
        )
    )
    assert (cfg.max_context, cfg.decode_slots, cfg.mix_gather_rows, cfg.mix_max_prompts, cfg.admit_coalesce_ms) == (
        2048,
        64,
        256,
        8,
        300,
    )


@pytest.mark.parametrize(
    "knob,value",
    [
        ("DECODE_SLOTS", "0"),
        ("DECODE_SLOTS", "257"),
        ("DECODE_SLOTS", "two"),
        ("MAX_CONTEXT", "32"),
        ("MAX_CONTEXT", "4k"),
        ("MIX_GATHER_ROWS", "0"),
        ("MIX_GATHER_ROWS", "off"),
        ("MIX_GATHER_ROWS", "-1"),
        ("MIX_MAX_PROMPTS", "0"),
        ("MIX_MAX_PROMPTS", "17"),
        ("MIX_MAX_PROMPTS", "all"),
        ("ADMIT_COALESCE_MS", "5000"),
        ("ASYNC_PREFILL", "green"),
        ("PREFIX_CACHE", "many"),
        ("MIX_CHUNK_TOKENS", "63"),
        ("MIX_CHUNK_TOKENS", "2k"),
        ("KV_CACHE_MB", "-3"),
        ("KV_CACHE_MB", "lots"),
        ("DEFAULT_MAX_TOKENS", "0"),
        ("DEFAULT_MAX_TOKENS", "unlimited"),
    ],
)
def test_a_bad_value_refuses_naming_the_knob_and_the_value(knob, value):
    with pytest.raises(KnobError) as e:
        resolve(table(**{knob: value}))
    assert f"TAILGATE_{knob}={value!r}" in str(e.value) and "accepted:" in str(e.value)


def test_the_kv_budget_is_auto_unless_given_or_switched_off():
    assert resolve(table(KV_CACHE_MB="AUTO")).kv_cache_mb == "auto"
    assert resolve(table(KV_CACHE_MB="off")).kv_cache_mb is None
    assert resolve(table(KV_CACHE_MB="512")).kv_cache_mb == 512
    with pytest.raises(KnobError, match="auto [|] off [|] N MiB"):
        resolve(table(KV_CACHE_MB="-5"))


def test_the_default_max_tokens_is_a_ceiling_unless_it_is_the_context():
    assert resolve(table()).default_max_tokens == 2048
    assert resolve(table(DEFAULT_MAX_TOKENS="100")).default_max_tokens == 100
    assert resolve(table(DEFAULT_MAX_TOKENS="context")).default_max_tokens is None
    with pytest.raises(KnobError, match="1 <= N <= MAX_CONTEXT \\(1024\\)"):
        resolve(table(MAX_CONTEXT="1024", DEFAULT_MAX_TOKENS="2000"))


def test_the_door_and_the_lane_refuse_together():
    with pytest.raises(KnobError, match="the door could only delay it"):
        resolve(table(ADMIT_COALESCE_MS="300", ASYNC_PREFILL="shared"))


def test_lanes_tailgate_does_not_build_refuse_instead_of_being_ignored():
    with pytest.raises(KnobError, match="CUDA stream, which tailgate does not build"):
        resolve(table(ASYNC_PREFILL="shared"), cores=2)
    assert resolve(table(ASYNC_PREFILL="cpu:1"), cores=2).async_prefill == "cpu:1"  # built: accepted
    assert resolve(table(PREFIX_CACHE="8")).prefix_cache == 8


def test_the_walk_width_is_settled_in_the_config():
    assert resolve(table(MIX_CHUNK_TOKENS="300", MAX_CONTEXT="1024")).mix_chunk_tokens == 256
    assert resolve(table(MIX_CHUNK_TOKENS="off")).mix_chunk_tokens is None
    assert resolve(table(MAX_CONTEXT="256", ITL_TARGET_MS="off")).mix_chunk_tokens == 64
    assert resolve(table(MAX_CONTEXT="64", ITL_TARGET_MS="off")).mix_chunk_tokens is None  # the default walk needs room


def test_chunk_width_rounds_down_to_whole_tiles():
    assert [parse_mix_chunk_tokens(v, 8192) for v in ("2496", "127", "128", "64", "off")] == [2432, 127, 128, 64, None]
    with pytest.raises(KnobError):
        parse_mix_chunk_tokens("8192", 8192)


def test_the_model_limit_caps_max_context():
    with pytest.raises(KnobError, match="exceeds the model's 8192"):
        resolve(table(MAX_CONTEXT="16384")).with_model_limit(8192)


def test_a_cli_flag_wins_over_the_environment():
    lookup = env_lookup({"DECODE_SLOTS": "8"}, environ={"TAILGATE_DECODE_SLOTS": "4", "TAILGATE_MAX_CONTEXT": "1024"})
    cfg = resolve(lookup)
    assert cfg.decode_slots == 8 and cfg.max_context == 1024


# Every integer knob, with a value it accepts: each refuses the same number spelled any other way.
INTEGER_KNOBS = [
    ("MAX_CONTEXT", "1024"),
    ("DECODE_SLOTS", "8"),
    ("MIX_GATHER_ROWS", "256"),
    ("MIX_MAX_PROMPTS", "2"),
    ("MIX_CHUNK_TOKENS", "128"),
    ("PREFIX_CACHE", "8"),
    ("ADMIT_COALESCE_MS", "100"),
    ("DEFAULT_MAX_TOKENS", "100"),
    ("KV_CACHE_MB", "100"),
]
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULL_WIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


def misspellings(n: str) -> list[str]:
    """`n` as int() or str.isdigit() would still read it (Python's int() takes all but the last)."""
    return [
        n.translate(ARABIC_INDIC),
        n.translate(FULL_WIDTH),
        " " + n,
        n + " ",
        "\t" + n,
        n + "\n",
        " ",
        "+" + n,
        n[0] + "_" + n[1:] if len(n) > 1 else n + "_0",
        "9" * 5000,
    ]


@pytest.mark.parametrize("knob,bad", [(k, b) for k, good in INTEGER_KNOBS for b in misspellings(good)])
def test_an_integer_knob_is_ascii_digits_with_nothing_around_them(knob, bad):
    good = dict(INTEGER_KNOBS)[knob]
    resolve(table(**{knob: good}))  # the number itself is accepted: only its spelling refuses
    with pytest.raises(KnobError) as e:
        resolve(table(**{knob: bad}))
    assert f"TAILGATE_{knob}={bad!r}" in str(e.value) and "accepted:" in str(e.value)


@pytest.mark.parametrize("bad", ["cpu:" + b for b in misspellings("1")] + [" cpu:1", "cpu:1 "])
def test_the_lane_width_is_ascii_digits_too(bad):
    assert resolve(table(ASYNC_PREFILL="cpu:1"), cores=64).async_prefill == "cpu:1"
    with pytest.raises(KnobError) as e:
        resolve(table(ASYNC_PREFILL=bad), cores=64)
    assert f"TAILGATE_ASYNC_PREFILL={bad!r}" in str(e.value) and "accepted:" in str(e.value)


@pytest.mark.parametrize(
    "knob,word,want",
    [
        ("KV_CACHE_MB", "OFF", None),
        ("KV_CACHE_MB", "Auto", "auto"),
        ("DEFAULT_MAX_TOKENS", "CONTEXT", None),
        ("PREFIX_CACHE", "Off", None),
        ("ASYNC_PREFILL", "FALSE", None),
        ("ITL_TARGET_MS", "OFF", None),
        ("ITL_TARGET_MS", "", None),  # "" is unset: the default (off)
        ("MIX_CHUNK_TOKENS", "", 64),
    ],
)  # unset: the walk's width
def test_words_are_read_in_any_case(knob, word, want):
    assert getattr(resolve(table(**{knob: word})), knob.lower()) == want


@pytest.mark.parametrize(
    "knob,bad",
    [
        ("KV_CACHE_MB", " off"),
        ("KV_CACHE_MB", "auto "),
        ("PREFIX_CACHE", "off\n"),
        ("DEFAULT_MAX_TOKENS", " context"),
        ("ASYNC_PREFILL", "off "),
        ("MIX_CHUNK_TOKENS", " 0"),
    ],
)
def test_words_refuse_surrounding_whitespace_as_numbers_do(knob, bad):
    # One rule for every value: ' 0' must not be off where ' 5' refuses.
    with pytest.raises(KnobError, match=re.escape(f"TAILGATE_{knob}={bad!r}")):
        resolve(table(**{knob: bad}))


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "+8000"],
        ["serve", "--port", " 8000"],
        ["serve", "--port", "٨٠٠٠"],
        ["serve", "--port", "65536"],
        ["serve", "--max-body-mb", "0"],
        ["serve", "--max-queued-requests", "1_000"],
        ["serve", "--drain-timeout", "30 "],
        ["serve", "--threads", "２"],
        ["generate", "hi", "--max-tokens", "+8"],
        ["generate", "hi", "--seed", "-1"],
        ["bench", "engine", "--concurrency", "4, 8"],
    ],
)
def test_integer_flags_refuse_what_int_would_forgive(argv, capsys):
    from tailgate.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)  # parsed only: nothing runs, whatever the parser accepts
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {argv[-2]}" in err and "accepted: N" in err, err


def test_an_explicit_walk_width_or_lane_keeps_the_default_target_off_and_an_explicit_target_caps_at_the_width():
    assert resolve(table(MIX_CHUNK_TOKENS="64")).itl_target_ms is None
    assert resolve(table(MIX_CHUNK_TOKENS="64")).mix_chunk_tokens == 64
    assert resolve(table(MIX_CHUNK_TOKENS="off")).itl_target_ms is None
    assert resolve(table(ASYNC_PREFILL="cpu:1"), cores=2).itl_target_ms is None
    assert resolve(table(MAX_CONTEXT="64")).itl_target_ms is None  # no room for the walk: nothing to price
    both = resolve(table(MIX_CHUNK_TOKENS="128", ITL_TARGET_MS="90"))
    assert (both.mix_chunk_tokens, both.itl_target_ms) == (128, 90)
    assert resolve(table(ITL_TARGET_MS="off")).mix_chunk_tokens == 64  # the fixed walk of before
