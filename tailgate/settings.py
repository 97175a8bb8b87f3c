"""The one declaration of tailgate's settings: `Settings`, a pydantic-settings model with a field
for every server setting and every scheduler knob. From its fields come the flags
(`--name-with-dashes`: server/args.py for serve, config.add_knob_args for the knobs of every
command that runs the scheduler), the `TAILGATE_<NAME>` environment variables, the `--config`
TOML keys (the field names) and the knob table (`config.KNOBS`: name, default, grammar, doc).

A knob's field holds its text as given; `config.resolve` parses every knob and checks them against
each other, through an injectable lookup, before any weights load (cross-knob rules do not fit a
field's validator). A server setting is parsed and checked by its field.

Imports pydantic only: config.py, the simulator and the CLI's parsers read it without torch or the
web stack.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

PREFIX = "TAILGATE_"

# max_tokens when a request sets none. vLLM's default is the rest of the context; a client that
# forgets it then holds a slot for up to MAX_CONTEXT tokens. 2048 bounds that work (and an
# abandoned request's) while leaving long answers possible; `context` restores vLLM's behaviour.
DEFAULT_MAX_TOKENS = 2048
# ITL_TARGET_MS when unset: off, the 64-row walk (why: config.resolve). `auto` is one flag away.
DEFAULT_ITL_TARGET = "off"
# TTFT_TARGET_MS under ITL_TARGET_MS=auto (why: step_cost.RoundBudget); off under N ms (config.resolve)
DEFAULT_TTFT_TARGET = "2000"
DEFAULT_WALK_TTFT = "500"  # TTFT_TARGET_MS under the default walk (why: config.resolve)
DOOR_GRAMMAR = "off | auto | N ms, 1 <= N <= 2000"
ITL_TARGET_GRAMMAR = "off | auto | N ms, 1 <= N <= 10000"
TTFT_TARGET_GRAMMAR = "off | N ms, 100 <= N <= 600000"
LANE_GRAMMAR = "off | 0 | false | shared | green:NN (1 <= NN <= 99) | cpu:N (1 <= N < cores)"
KEEP_ALIVE_GRAMMAR = "off | N, 1 <= N <= 3600 (seconds)"


def ascii_digits(raw: str) -> bool:
    """An integer is ASCII digits and nothing else. str.isdigit() also takes other scripts' digits
    ('١٠٠') and int() also takes surrounding whitespace, a sign and '_' ('1_000'): each would give
    one value several spellings, and a typo its nearest reading instead of a refusal."""
    return raw.isascii() and raw.isdigit()


def _uint(v):
    if isinstance(v, str):
        if not ascii_digits(v):
            raise ValueError("not ASCII digits")
        return int(v) if len(v) <= 19 else 1 << 64
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("not an integer")
    return v


def UInt(lo: int = 0, hi: int = (1 << 63) - 1, grammar: str | None = None):
    g = grammar or f"N, {lo} <= N <= {hi}, ASCII digits only"
    return Annotated[int, Field(ge=lo, le=hi, json_schema_extra={"grammar": g}), BeforeValidator(_uint)]


def _off_or_seconds(v):
    return None if v == "off" else _uint(v)


def _knob_text(v):
    """A knob is text, parsed by config.resolve with the others; a TOML integer is its digits."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("a knob is a string or an integer")
    return str(v)


def knob(default: str, grammar: str, doc: str):
    """A scheduler knob's field: unset (None) unless given; `default` says what unset means."""
    return Field(None, description=doc, json_schema_extra={"knob": True, "grammar": grammar, "default": default})


KnobText = Annotated[str | None, BeforeValidator(_knob_text)]


class Settings(BaseSettings):
    """Every setting of `tailgate serve`: the server's (typed, checked here) and the scheduler's
    knobs (text, checked together by config.resolve). Read from, in order: flags, `TAILGATE_<NAME>`,
    the `--config` file (server/settings.py `load`), then these defaults."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", case_sensitive=False)

    # The model's flags (cli.py adds them to every command that loads one; these read them for serve).
    model: str = "gemma3-270m"
    gguf_file: str | None = None  # which GGUF file of a hub id or a directory holding several
    dtype: str = "auto"  # these three are checked where they are used (model/kernels/choice.py's choose)
    kernels: str = "auto"
    device: str = "auto"
    threads: UInt() = 0
    host: str = "127.0.0.1"
    port: UInt(0, 65535) = 8000
    api_key: str | None = Field(
        None,
        description="require `Authorization: Bearer KEY` on every /v1 route (or set TAILGATE_API_KEY, "
        "which `ps` does not show)",
    )
    allowed_hosts: str | None = Field(
        None,
        description="comma-separated Host names to answer besides loopback ones (a loopback server answers "
        "only those by default; `*`: any)",
    )
    allowed_origins: str | None = Field(
        None,
        description="comma-separated browser origins answered cross-origin (CORS, with preflight; off by "
        "default; `*`: any)",
    )
    served_model_name: str | None = None
    chat_template: str | None = Field(
        None,
        description="serve this chat template instead of the model's: a file, or the template itself "
        "(as vLLM reads it; or set TAILGATE_CHAT_TEMPLATE)",
    )
    max_queued_requests: UInt() = Field(256, description="429 beyond this many waiting requests")
    max_queued_tokens: UInt() = Field(1 << 20, description="429 beyond this many waiting prompt tokens")
    max_body_mb: UInt(1) = Field(8, description="413 for request bodies past this many MiB")
    drain_timeout: UInt() = Field(30, description="seconds SIGTERM waits for in-flight requests")
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text",
        description="one object a line with json; either way one access line per finished generation "
        "request: id, status, tokens, TTFT, end-to-end",
    )
    # 15 s: under the 30-60 s idle timeouts of common proxies and load balancers (nginx's
    # proxy_read_timeout is 60 s), so a stream queued behind a long batch is not cut.
    sse_keep_alive: Annotated[
        int | None,
        Field(ge=1, le=3600, json_schema_extra={"grammar": KEEP_ALIVE_GRAMMAR}),
        BeforeValidator(_off_or_seconds),
    ] = Field(15, description="a `: keep-alive` comment on a stream silent N seconds (queued, or a long step)")
    # Off by default: on AMD EPYC Zen 5 (W-std c8, vLLM's client) 20 ms cut the delivery delay's p99
    # from 7-10 to 4-5 ms, but moved the client's ITL p99 and tok/s only within the default's own
    # run-to-run spread (docs/engine.md "Delivery", docs/benchmarks/socket-tail.md).
    delivery_wait_ms: UInt(0, 1000) = Field(
        0,
        description="before each step the engine waits up to N ms for the streams to write the last step's "
        "tokens to their sockets (0: never waits; docs/engine.md 'Delivery')",
    )
    grammar_warmup: bool = Field(
        True,
        description="build the grammar engine's view of the vocabulary before ready (seconds for a 262k "
        "vocabulary, holding the GIL), so the first structured output or tool call does not stall the streams",
    )
    # The fleet (tailgate/fleet/, docs/scale-out.md): N > 1 runs N engine replicas on Ray Serve.
    replicas: UInt(1) = Field(
        1,
        description="engine replicas behind this endpoint, each with cores/N threads and its own KV cache "
        "(N > 1: Ray Serve, the ray extra)",
    )
    ray_address: str | None = Field(
        None, description="join this Ray cluster (default: start a local one, stopped with the command)"
    )
    router: Literal["prefix", "least-loaded", "random", "pow2"] | None = Field(
        None,
        description="how a request picks its replica (default prefix: longest cached prefix unless out of "
        "balance; pow2: Ray Serve's own power-of-two choices)",
    )

    # The scheduler's knobs (docs/knobs.md; why each default: config.resolve and the files it names).
    max_context: KnobText = knob(
        "min(4096, model limit)",
        "N, 64 <= N <= model's max positions",
        "serving ceiling: one request's prompt + max_tokens. The KV cache holds DECODE_SLOTS x MAX_CONTEXT "
        "tokens unless KV_CACHE_MB bounds it, so a lower ceiling costs less memory and refuses longer requests",
    )
    decode_slots: KnobText = knob("16", "N, 1 <= N <= 256", "roster size: requests decoding together")
    mix_gather_rows: KnobText = knob(
        "512",
        "N, 1 <= N <= MAX_CONTEXT",
        "followers join a mixed step only while the gathered prompt rows stay within N (the leader is never bounded)",
    )
    mix_max_prompts: KnobText = knob(
        "min(4, DECODE_SLOTS)",
        "N, 1 <= N <= DECODE_SLOTS",
        "most prompts one mixed step absorbs; also the door's cohort cap",
    )
    mix_chunk_tokens: KnobText = knob(
        "unset: 64 (a cap under ITL_TARGET_MS=auto; uncapped under an ITL_TARGET_MS of N ms; off when MAX_CONTEXT <= 64)",
        "off | N, 64 <= N < MAX_CONTEXT (>=128 rounds down to x128)",
        "chunked walk: gathered prompts enter the live batch at most N rows per step, one round per iteration "
        "(replaces MIX_GATHER_ROWS)",
    )
    async_prefill: KnobText = knob(
        "off",
        LANE_GRAMMAR,
        "side-lane prefill: an admission into a live batch prefills on a worker with N threads of its own while "
        "decode keeps stepping on the rest (one in flight; intake waits); shared/green:NN are the seed's CUDA "
        "lanes and refuse here; refuses with the door",
    )
    prefix_cache: KnobText = knob(
        "off",
        "off | K, 1 <= K <= 1024",
        "remember up to K prompts' full KV pages as hashed blocks (and a preempted request's, for its recompute); "
        "a prompt resumes at its longest cached prefix (LRU; cached pages pin nothing: an allocation evicts idle "
        "ones only when none is free)",
    )
    admit_coalesce_ms: KnobText = knob(
        "off",
        DOOR_GRAMMAR,
        "admission coalesce door: hold arrivals into a deep live batch up to N ms; auto: hold only while "
        "the stall it spares live streams (learned step costs) exceeds the wait it adds",
    )
    itl_target_ms: KnobText = knob(
        DEFAULT_ITL_TARGET,
        ITL_TARGET_GRAMMAR,
        "inter-token target: each walk round takes the most prompt rows whose predicted step time (a step-cost "
        "model fitted online from the engine's own steps) stays within N ms (auto: 2x the live batch's own "
        "predicted decode step, never more rows than the walk's width, evened over the walkers' rest; the walk's "
        "width while the fit's error "
        "says it does not know this CPU), at least one; an idle engine prefills at full width (auto: the walk's "
        "width). N ms is a tail budget: TTFT_TARGET_MS is off under it unless given, so a saturated loop keeps "
        "the budget and its wait moves to the queue (first tokens later). Turns the walk on; MIX_CHUNK_TOKENS, when set, caps every round; given explicitly it refuses "
        "with MIX_CHUNK_TOKENS=off and with ASYNC_PREFILL (unset, the default yields to them)",
    )
    ttft_target_ms: KnobText = knob(
        f"{DEFAULT_WALK_TTFT} (the default walk), {DEFAULT_TTFT_TARGET} (under ITL_TARGET_MS=auto), off (under "
        "an ITL_TARGET_MS of N ms, whose budget it would widen past; a MIX_CHUNK_TOKENS given)",
        TTFT_TARGET_GRAMMAR,
        "a walk round widens past its width (MIX_CHUNK_TOKENS, or the inter-token target's price) "
        "to the prompt rows that clear every waiting prompt (the walkers' rest and the queue's) within N ms at the "
        "predicted step time, so arrivals do not queue behind narrow rounds; under the walk only a round no live "
        "stream rides widens so, or any round once a walker has waited 6 x N (engine/step_cost.py LATE: a closed "
        "loop's waves stay apart); a widened round stays within a "
        "150 ms predicted step (engine/step_cost.py WIDEN_S), so a CPU where prompt rows are dear keeps its "
        "walk; under the walk it also prices a round live streams ride: the walk's width while that costs at most "
        "2.5 x their own decode step (engine/step_cost.py WALK_FACTOR), else the rows within that price, never "
        "fewer than keep every request in the system decoding (its prompt rows per output token, a running mean) nor than absorb prompt rows at 0.95 x the walk's rate (engine/step_cost.py WALK_RATE); "
        "off: the fixed width alone. It refuses where there is no walk (MIX_CHUNK_TOKENS=off, a lane)",
    )
    default_max_tokens: KnobText = knob(
        f"min({DEFAULT_MAX_TOKENS}, MAX_CONTEXT)",
        "context | N, 1 <= N <= MAX_CONTEXT",
        "max_tokens of a request that sets none (never past the context); context: the rest of the context, "
        "as vLLM does",
    )
    kv_cache_mb: KnobText = knob(
        "auto",
        "auto | off | N MiB, 1 <= N <= 1048576",
        "size the global KV pool from a memory budget instead of DECODE_SLOTS x MAX_CONTEXT; a live row "
        "that cannot grow preempts the latest arrival (requeued at the head, recomputed). The trade: fewer MiB "
        "hold less context at once, so long requests preempt each other (recomputed work, later first tokens); "
        "more leave less RAM to everything else. auto: DECODE_SLOTS x MAX_CONTEXT while that fits half the RAM "
        "available at start (within a container, what its memory limit leaves), else half that RAM; off: DECODE_SLOTS x MAX_CONTEXT whatever the RAM. The start "
        "log and /version (kv_cache) say what it holds and why",
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file = settings_cls.model_config.get("file_values")  # the config file's keys (server/settings.py `load`)
        return (init_settings, env_settings) + ((InitSettingsSource(settings_cls, file),) if file else ())


def is_knob(name: str) -> bool:
    return bool((Settings.model_fields[name].json_schema_extra or {}).get("knob"))


KNOB_FIELDS = tuple(n for n in Settings.model_fields if is_knob(n))  # the scheduler's knobs, in table order
SERVER_FIELDS = tuple(n for n in Settings.model_fields if not is_knob(n))
