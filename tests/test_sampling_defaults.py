"""A model's recommended sampling (an HF directory's generation_config.json) is what a request that
sets none gets, as vLLM serves it by default; a request's own values win (issue 44)."""

from __future__ import annotations

import json

from tailgate.model.formats.hf_loader import sampling_defaults
from tailgate.server.protocol import parse_common


def test_generation_config_sampling_keys_become_the_defaults_and_greedy_configs_ask_nothing(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "eos_token_id": 2, "x": True})
    )
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "do_sample": False}))
    assert sampling_defaults(tmp_path) == {}
    assert sampling_defaults(tmp_path / "absent") == {} and sampling_defaults(tmp_path / "m.gguf") == {}


def test_a_request_gets_the_models_defaults_for_what_it_leaves_unset_and_keeps_its_own():
    defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1}
    g, _ = parse_common({"prompt": "x", "temperature": 0.0}, "completion", 100, defaults)
    p = g.params
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.min_p) == (0.0, 0.95, 20, 1.1, 0.0)
    g, _ = parse_common({"prompt": "x"}, "completion", 100, None)
    assert (g.params.temperature, g.params.top_p, g.params.top_k) == (1.0, 1.0, 0)
