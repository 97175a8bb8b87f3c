"""Every setting `tailgate serve` gives its app reaches each replica of a fleet (issue 37:
--allowed-origins, --sse-keep-alive and --log-format stopped at fleet/launch.py; a CORS preflight
on --replicas 2 got a 405). Built without Ray: the spec the fleet ships and the state a replica
builds from it."""

from __future__ import annotations

import dataclasses

from tailgate.cli import build_parser
from tailgate.config import resolve
from tailgate.fleet.launch import replica_spec
from tailgate.fleet.replica import replica_state
from tailgate.model.kernels.choice import choose
from tailgate.server.main import state_settings
from tailgate.server.settings import apply
from tailgate.server.state import ServerState

FLAGS = [
    "serve",
    "--replicas",
    "2",
    "--allowed-origins",
    "https://a.example, https://b.example",
    "--sse-keep-alive",
    "7",
    "--log-format",
    "json",
    "--api-key",
    "sk-test",
    "--max-queued-requests",
    "9",
    "--max-queued-tokens",
    "4096",
    "--max-body-mb",
    "3",
    "--served-model-name",
    "mine",
    "--delivery-wait-ms",
    "5",
]


def test_every_app_setting_of_the_serve_flags_reaches_a_replica_and_the_log_format_its_logger():
    args = build_parser().parse_args(FLAGS)
    apply(args)  # as `tailgate serve` does first: flags, TAILGATE_<NAME>, --config, each resolved once
    settings = state_settings(args, {})
    # the settings the flags decide, all of them non-default here, so a dropped one shows
    defaults = {f.name: f.default for f in dataclasses.fields(ServerState)}
    assert all(settings[k] != defaults[k] for k in settings), settings
    assert settings["allowed_origins"] == ("https://a.example", "https://b.example") and settings["keep_alive_s"] == 7
    spec = replica_spec(args, resolve(lambda k: None), choose(), None)
    state = replica_state(spec)
    for k, v in settings.items():
        assert getattr(state, k) == v, k
    assert state.served_name == "mine" and state.allowed_hosts is None and state.kernels == choose().as_dict()
    assert spec["log_format"] == "json" and spec["log_level"] == args.log_level


# Every serve setting and how a replica gets it: a spec key (compared with the resolved value),
# the app state (compared above), or the front alone (it binds, checks Host, drains and routes).
SPEC = {
    "model": "model",
    "dtype": "dtype",
    "device": "device",
    "kernels": "kernels",
    "log_level": "log_level",
    "log_format": "log_format",
    "grammar_warmup": "grammar_warmup",
    "served_model_name": "served_name",
}
STATE = {
    "api_key",
    "allowed_origins",
    "max_queued_requests",
    "max_queued_tokens",
    "max_body_mb",
    "sse_keep_alive",
    "delivery_wait_ms",
}
FRONT = {"host", "port", "allowed_hosts", "drain_timeout", "replicas", "ray_address", "router"}
OTHER = {
    "gguf_file": "resolved into `model` before the fleet starts (cli.local_model)",
    "threads": "a replica's own cores/N unless given (spec threads)",
    "chat_template": "spec chat_template",
}


def test_every_serve_setting_is_accounted_for_on_its_way_to_a_replica():
    from tailgate.config import cli_lookup
    from tailgate.settings import KNOB_FIELDS, Settings

    # ... and each scheduler knob, through the engine's settled config (spec "config").
    assert set(SPEC) | STATE | FRONT | set(OTHER) | set(KNOB_FIELDS) == set(Settings.model_fields)
    args = build_parser().parse_args(FLAGS + ["--grammar-warmup", "false", "--threads", "1", "--decode-slots", "3"])
    apply(args)
    spec = replica_spec(args, resolve(cli_lookup(args)), choose(), "{{ messages }}")
    for field, key in SPEC.items():
        assert spec[key] == getattr(args, field), field
    assert spec["threads"] == 1 and spec["chat_template"] == "{{ messages }}" and spec["config"].decode_slots == 3
