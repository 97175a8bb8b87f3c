"""The knob table: one resolve, an injectable lookup, refusals that name knob, value, grammar."""
from __future__ import annotations

import pytest

from tailgate.config import KnobError, ServingConfig, env_lookup, parse_mix_chunk_tokens, resolve


def table(**overrides):
    return lambda name: overrides.get(name)


def test_defaults_resolve_without_any_knob():
    cfg = resolve(table())
    assert cfg == ServingConfig(None, 16, 512, 4, 64, None, None, None, "auto")
    assert cfg.with_model_limit(32768).max_context == 4096
    assert cfg.with_model_limit(2048).max_context == 2048


def test_knobs_parse_into_the_config():
    cfg = resolve(table(MAX_CONTEXT="2048", DECODE_SLOTS="64", MIX_GATHER_ROWS="256", MIX_MAX_PROMPTS="8",
                        ADMIT_COALESCE_MS="300"))
    assert (cfg.max_context, cfg.decode_slots, cfg.mix_gather_rows, cfg.mix_max_prompts, cfg.admit_coalesce_ms) == \
        (2048, 64, 256, 8, 300)


@pytest.mark.parametrize("knob,value", [
    ("DECODE_SLOTS", "0"), ("DECODE_SLOTS", "257"), ("DECODE_SLOTS", "two"),
    ("MAX_CONTEXT", "32"), ("MAX_CONTEXT", "4k"),
    ("MIX_GATHER_ROWS", "0"), ("MIX_GATHER_ROWS", "off"), ("MIX_GATHER_ROWS", "-1"),
    ("MIX_MAX_PROMPTS", "0"), ("MIX_MAX_PROMPTS", "17"), ("MIX_MAX_PROMPTS", "all"),
    ("ADMIT_COALESCE_MS", "5000"), ("ASYNC_PREFILL", "green"), ("PREFIX_CACHE", "many"),
    ("MIX_CHUNK_TOKENS", "63"), ("MIX_CHUNK_TOKENS", "2k"), ("KV_CACHE_MB", "-3"), ("KV_CACHE_MB", "lots"),
    ("DEFAULT_MAX_TOKENS", "0"), ("DEFAULT_MAX_TOKENS", "unlimited"),
])
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
    assert resolve(table(MAX_CONTEXT="256")).mix_chunk_tokens == 64
    assert resolve(table(MAX_CONTEXT="64")).mix_chunk_tokens is None  # the default walk needs room


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
