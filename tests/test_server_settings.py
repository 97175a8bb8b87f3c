"""The server's settings (flags, TAILGATE_<NAME>, a TOML config file: server/settings.py), and what
three of them turn on: SSE keep-alive comments, CORS, JSON access logs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager

import httpx
import pytest

from tailgate.config import KNOB_NAMES
from tailgate.server.settings import FIELDS, SettingsError, load
from live import log_tail, start_server, stop_server, until


def test_a_flag_beats_its_env_var_which_beats_the_config_file(tmp_path, monkeypatch):
    cfg = tmp_path / "serve.toml"
    cfg.write_text('port = 7001\nhost = "0.0.0.0"\nmax_queued_requests = 12\nsse_keep_alive = "off"\n')
    monkeypatch.setenv("TAILGATE_PORT", "7002")
    monkeypatch.setenv("TAILGATE_HOST", "::1")
    s = load({"port": 7003}, config=str(cfg))
    assert (s.port, s.host, s.max_queued_requests, s.sse_keep_alive, s.log_format) == (7003, "::1", 12, None, "text")
    monkeypatch.setenv("TAILGATE_CONFIG", str(cfg))
    assert load({}).port == 7002


@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"TAILGATE_PORT": " 80"},
            "TAILGATE_PORT=' 80' not recognized (accepted: N, 0 <= N <= 65535, ASCII digits only)",
        ),
        ({"TAILGATE_MAX_BODY_MB": "0"}, "TAILGATE_MAX_BODY_MB='0' not recognized (accepted: N, 1 <= N"),
        (
            {"TAILGATE_SSE_KEEP_ALIVE": "1_0"},
            "TAILGATE_SSE_KEEP_ALIVE='1_0' not recognized (accepted: off | N, 1 <= N <= 3600",
        ),
        ({"TAILGATE_LOG_FORMAT": "xml"}, "TAILGATE_LOG_FORMAT='xml' not recognized (accepted: text | json)"),
    ],
)
def test_a_bad_env_value_refuses_naming_the_variable_the_value_and_the_grammar(monkeypatch, env, says):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as e:
        load({})
    assert says in str(e.value)


def test_a_config_file_key_that_is_no_setting_refuses_naming_it(tmp_path):
    cfg = tmp_path / "serve.toml"
    cfg.write_text("prot = 8000\n")
    with pytest.raises(SettingsError, match="unknown setting 'prot'"):
        load({}, config=str(cfg))


def test_every_serve_flag_and_every_knob_is_a_field_of_the_one_settings_declaration():
    from tailgate.cli import build_parser
    from tailgate.config import KNOBS
    from tailgate.settings import Settings

    args = build_parser().parse_args(["serve"])
    flags = {k.removeprefix("knob_").lower() for k in vars(args)} - {"cmd", "fn", "config"}
    assert flags == set(Settings.model_fields) == set(FIELDS) | {k.lower() for k in KNOB_NAMES}
    assert all(v is None for k, v in vars(args).items() if k not in ("cmd", "fn"))  # unset until apply
    # The knob table (docs, --help) is the declaration's knob fields, in order, with their words.
    for k in KNOBS:
        f = Settings.model_fields[k.name.lower()]
        assert (k.doc, k.grammar, k.default) == (
            f.description,
            f.json_schema_extra["grammar"],
            f.json_schema_extra["default"],
        )


def test_serve_refuses_a_bad_setting_before_any_weights_load(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "tailgate.cli", "serve", "--model", str(tmp_path / "missing.gguf")],
        env={"TAILGATE_SSE_KEEP_ALIVE": "0", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert "TAILGATE_SSE_KEEP_ALIVE='0' not recognized" in p.stderr and "missing.gguf" not in p.stderr, p.stderr


# Every scheduler knob as a config file key (issue 37), each off its default.
KNOBS_TOML = """
max_context = 2048
decode_slots = 4
mix_gather_rows = 256
mix_max_prompts = 1
mix_chunk_tokens = 96
async_prefill = "off"
prefix_cache = 8
admit_coalesce_ms = 250
itl_target_ms = 80
ttft_target_ms = 1500
default_max_tokens = 300
kv_cache_mb = 256
"""
# What the configured server runs: the file's values, except where an env var beats it (DECODE_SLOTS
# below; MAX_CONTEXT 512 and DEFAULT_MAX_TOKENS 24 from every test server's env, live.ENV).
KNOBS_SERVED = {
    "max_context": 512,
    "decode_slots": 1,
    "mix_gather_rows": 256,
    "mix_max_prompts": 1,
    "mix_chunk_tokens": 96,
    "async_prefill": None,
    "prefix_cache": 8,
    "admit_coalesce_ms": 250,
    "itl_target_ms": 80,
    "ttft_target_ms": 1500,
    "default_max_tokens": 24,
    "kv_cache_mb": 256,
}


def test_a_config_file_knob_is_read_beneath_its_flag_and_env_var(tmp_path, monkeypatch):
    from tailgate.config import cli_lookup, resolve
    from tailgate.cli import build_parser
    from tailgate.server.settings import apply

    cfg = tmp_path / "serve.toml"
    cfg.write_text(KNOBS_TOML)
    monkeypatch.setenv("TAILGATE_DECODE_SLOTS", "2")
    args = build_parser().parse_args(["serve", "--config", str(cfg), "--mix-max-prompts", "2"])
    apply(args)
    got = resolve(cli_lookup(args))
    assert (got.max_context, got.decode_slots, got.mix_max_prompts, got.itl_target_ms) == (2048, 2, 2, 80)
    assert {k.upper() for k in KNOBS_SERVED} == set(KNOB_NAMES)  # every knob is a key


def test_a_config_file_knob_of_the_wrong_type_or_value_refuses_naming_it(tmp_path):
    from tailgate.config import KnobError, cli_lookup, resolve
    from tailgate.cli import build_parser
    from tailgate.server.settings import apply

    cfg = tmp_path / "serve.toml"
    cfg.write_text("decode_slots = [4]\n")
    with pytest.raises(SettingsError, match="decode_slots = \\[4\\]: a knob is a string or an integer"):
        load({}, config=str(cfg))
    cfg.write_text("decode_slots = 0\n")
    args = build_parser().parse_args(["serve", "--config", str(cfg)])
    apply(args)
    with pytest.raises(KnobError) as e:
        resolve(cli_lookup(args))
    assert str(e.value).startswith(f"{cfg}: decode_slots='0' out of range (accepted: N, 1 <= N <= 256)")


def test_a_bad_knob_is_named_where_it_was_given_never_as_an_env_var_nobody_set(tmp_path, monkeypatch):
    """Issue 44: a flag's or a config file's bad knob was reported as TAILGATE_<NAME>."""
    from tailgate.config import KnobError, cli_lookup, resolve
    from tailgate.cli import build_parser
    from tailgate.server.settings import apply

    def refusal(argv):
        args = build_parser().parse_args(["serve", *argv])
        apply(args)
        with pytest.raises(KnobError) as e:
            resolve(cli_lookup(args), cores=2)
        return str(e.value)

    assert refusal(["--decode-slots", "x"]).startswith("--decode-slots='x' not recognized")
    cfg = tmp_path / "serve.toml"
    cfg.write_text('admit_coalesce_ms = "auto"\nasync_prefill = "cpu:1"\n')
    assert refusal(["--config", str(cfg)]).startswith(
        f"{cfg}: admit_coalesce_ms='auto' refuses with {cfg}: async_prefill='cpu:1'"
    )
    monkeypatch.setenv("TAILGATE_ITL_TARGET_MS", "fast")
    assert refusal([]).startswith("TAILGATE_ITL_TARGET_MS='fast' not recognized")


def test_a_mistyped_tailgate_env_var_refuses_naming_the_nearest_setting(monkeypatch):
    monkeypatch.setenv("TAILGATE_DECODE_SLOT", "4")
    with pytest.raises(SettingsError) as e:
        load({})
    assert str(e.value).startswith("TAILGATE_DECODE_SLOT is not a setting (did you mean TAILGATE_DECODE_SLOTS?")


def test_vllms_names_for_the_same_knobs_are_accepted():
    from tailgate.config import PREFIX_CACHE_ON, cli_lookup, resolve
    from tailgate.cli import build_parser
    from tailgate.server.settings import apply

    args = build_parser().parse_args(
        ["serve", "--max-model-len", "1024", "--max-num-seqs", "8", "--enable-prefix-caching"]
    )
    apply(args)
    got = resolve(cli_lookup(args))
    assert (got.max_context, got.decode_slots, got.prefix_cache) == (1024, 8, int(PREFIX_CACHE_ON))
    args = build_parser().parse_args(["serve", "--no-enable-prefix-caching"])
    apply(args)
    assert resolve(cli_lookup(args)).prefix_cache is None


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    """A server given one setting per source: keep-alive and every scheduler knob from the config
    file, CORS from the environment, JSON logs from a flag; one decode slot (the env var beats
    the file's 4), so a second stream waits in the queue."""
    cfg = tmp_path_factory.mktemp("cfg") / "serve.toml"
    cfg.write_text("sse_keep_alive = 1\n" + KNOBS_TOML)
    p, base, _ = start_server(
        args=["--config", str(cfg), "--log-format", "json", "--log-level", "info", "--grammar-warmup", "true"],
        TAILGATE_ALLOWED_ORIGINS="http://app.example",
        TAILGATE_DECODE_SLOTS="1",
    )
    yield p, base
    stop_server(p)


def test_a_config_file_with_every_knob_starts_a_server_with_those_values(configured):
    _, base = configured
    assert httpx.get(f"{base}/version").json()["knobs"] == KNOBS_SERVED


def test_the_grammar_vocabulary_is_built_before_ready_when_asked(configured):
    p, _ = configured
    lines = open(p.log_path).read().splitlines()
    built = next(i for i, x in enumerate(lines) if "the grammar engine's vocabulary built in" in x)
    ready = next(i for i, x in enumerate(lines) if '"ready: open' in x or "ready: open" in x)
    assert built < ready


HOLD = {"prompt": "Count to one hundred:", "max_tokens": 400, "ignore_eos": True, "stream": True}


@contextmanager
def the_only_slot_held(base):
    """A stream that holds the server's one decode slot (400 tokens: seconds on any CPU) until the
    block ends or the event it yields is set (the holder then hangs up and the server aborts it),
    so a request made inside the block waits in the queue past sse_keep_alive."""
    started, done = threading.Event(), threading.Event()

    def hold():
        with httpx.stream("POST", base + "/v1/completions", json=HOLD, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    started.set()
                if done.is_set():
                    return

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert started.wait(300)
    try:
        yield done
    finally:
        done.set()
        t.join(300)


def test_a_stream_waiting_in_the_queue_gets_keep_alive_comments(configured):
    _, base = configured
    with the_only_slot_held(base):
        with httpx.stream("POST", base + "/v1/completions", json={**HOLD, "max_tokens": 2}, timeout=120) as r:
            # queued behind the first: its first line comes after sse_keep_alive = 1 s of silence
            first_line = next(line for line in r.iter_lines() if line)
    assert first_line == ": keep-alive"


def stripping_reader(reads) -> list[dict]:
    """The events a client gets that reads SSE the way vLLM's `bench serve` does: it strips every
    network read, appends it to a buffer, cuts the buffer at blank lines, skips messages that start
    with ':' (comments) and takes a trailing buffer as an event once it parses as JSON."""
    buf, events = "", []
    for raw in reads:
        buf += raw.decode().strip()
        while "\n\n" in buf:
            msg, buf = buf.split("\n\n", 1)
            if msg.strip() and not msg.strip().startswith(":"):
                events.append(msg.strip())
        if buf.startswith("data: "):
            rest = buf.removeprefix("data: ").strip()
            try:
                if rest == "[DONE]" or json.loads(rest) is not None:
                    events.append(buf.strip())
                    buf = ""
            except json.JSONDecodeError:
                pass
    return [json.loads(e.removeprefix("data: ")) for e in events if e != "data: [DONE]"]


QUEUED = {**HOLD, "max_tokens": 6, "stream_options": {"include_usage": True}}


def test_a_stream_that_got_a_keep_alive_loses_no_token_in_a_client_that_strips_each_read(configured):
    """Issue 42: a lone `: keep-alive` glued itself to the next event in vLLM's client, which then
    skipped that event as a comment (2 of 16 streams "never received a valid chunk")."""
    _, base = configured
    reads = []
    with the_only_slot_held(base) as release:
        with httpx.stream("POST", base + "/v1/completions", json=QUEUED, timeout=600) as r:
            for x in r.iter_raw():
                reads.append(x)
                if b": keep-alive" in x:  # it waited in the queue past sse_keep_alive: let it in
                    release.set()
    assert any(b": keep-alive" in x for x in reads)
    events = stripping_reader(reads)
    tokens = [e for e in events if e.get("choices")]
    assert len(tokens) == 6 and events[-1]["usage"]["completion_tokens"] == 6


def test_a_stream_that_got_a_keep_alive_loses_no_token_in_the_openai_sdk(configured):
    """Issue 42 item 6: the `openai` SDK's own SSE decoder, on a stream that waited in the queue
    past sse_keep_alive, yields every token and the usage, and no comment as a chunk."""
    from openai import OpenAI

    _, base = configured
    with the_only_slot_held(base) as release:
        seen = KeepAliveWatch(release)
        client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, http_client=httpx.Client(transport=seen))
        model = client.models.list().data[0].id
        body = {k: v for k, v in QUEUED.items() if k not in ("stream", "ignore_eos")}
        chunks = list(client.completions.create(model=model, stream=True, extra_body={"ignore_eos": True}, **body))
    assert seen.fired  # it waited in the queue past sse_keep_alive
    assert sum(1 for c in chunks if c.choices) == 6 and chunks[-1].usage.completion_tokens == 6


class KeepAliveWatch(httpx.HTTPTransport):
    """The SDK's transport, watched: the first `: keep-alive` in a response's bytes sets `release`
    (the slot's holder hangs up, so the waiting stream runs). The SDK reads the same bytes."""

    def __init__(self, release: threading.Event):
        super().__init__()
        self.release, self.fired = release, False

    def handle_request(self, request):
        response = super().handle_request(request)
        response.stream = WatchedStream(response.stream, self)
        return response

    def saw(self, chunk: bytes) -> None:
        if not self.fired and b": keep-alive" in chunk:
            self.fired = True
            self.release.set()


class WatchedStream(httpx.SyncByteStream):
    """A response's bytes as they come, each shown to `watch` first."""

    def __init__(self, inner, watch: KeepAliveWatch):
        self.inner, self.watch = inner, watch

    def __iter__(self):
        for chunk in self.inner:
            self.watch.saw(chunk)
            yield chunk

    def close(self):
        self.inner.close()


def test_cors_answers_a_preflight_from_an_allowed_origin_only(configured):
    _, base = configured
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,authorization"}
    ok = httpx.options(base + "/v1/chat/completions", headers={"Origin": "http://app.example", **ask})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
    other = httpx.options(base + "/v1/chat/completions", headers={"Origin": "http://evil.example", **ask})
    assert "access-control-allow-origin" not in other.headers
    got = httpx.get(base + "/v1/models", headers={"Origin": "http://app.example"})
    assert got.headers["access-control-allow-origin"] == "http://app.example"


def test_json_logs_carry_one_access_line_per_finished_request(configured):
    p, base = configured
    r = httpx.post(base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}, timeout=120)
    rid = r.json()["id"]

    def line():
        for raw in log_tail(p, 400).splitlines():
            if raw.startswith("{") and rid in raw:
                return json.loads(raw)

    assert until(lambda: line() is not None, 30), log_tail(p)
    rec = line()
    assert rec["logger"] == "tailgate.access" and rec["status"] == 200 and rec["path"] == "/v1/completions"
    assert rec["completion_tokens"] == 3 and rec["prompt_tokens"] > 0 and rec["ttft_s"] <= rec["e2e_s"]


def test_json_logs_are_json_on_every_line_progress_bars_included(configured):
    """Issue 44: tqdm's bars (tokenizer, map tensors) wrote plain text between the JSON lines."""
    p, _ = configured
    lines = [x for x in open(p.log_path).read().splitlines() if x.strip()]
    not_json = []
    for x in lines:
        try:
            json.loads(x)
        except ValueError:
            not_json.append(x)
    assert lines and not not_json, not_json[:5]
