"""The knobs' parsing: every serving knob read through an injectable `lookup(name) -> str | None`
(tests never touch os.environ), parsed and cross-checked in `resolve` before any weights load. The
knobs themselves (name, default, grammar, doc) are declared once, as fields of `settings.Settings`;
`KNOBS` is that table. Each is read as the env var TAILGATE_<NAME> or the CLI flag
--<name-with-dashes> (the flag wins), then a `serve --config` file's key. An unknown value refuses
to start with a message naming the knob, the value and the accepted grammar. A value is read as
written: an integer is ASCII digits alone, a word matches in any case, and neither may carry
surrounding whitespace (one rule, so ' 0' is not off where ' 5' refuses).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

from .settings import (
    DEFAULT_ITL_TARGET,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TTFT_TARGET,
    DEFAULT_WALK_TTFT,
    DOOR_GRAMMAR,
    ITL_TARGET_GRAMMAR,
    KNOB_FIELDS,
    LANE_GRAMMAR,
    PREFIX,
    TTFT_TARGET_GRAMMAR,
    Settings,
    ascii_digits,
)

OFF_WORDS = ("", "0", "off")
DEFAULT_CHUNK = 64  # MIX_CHUNK_TOKENS when unset (the grammar's floor; why: the comment in resolve)


class KnobError(ValueError):
    pass


def _refuse(name: str, raw: str, grammar: str, why: str = "not recognized") -> KnobError:
    return KnobError(f"{PREFIX}{name}={raw!r} {why} (accepted: {grammar})")


def _int_in(name: str, raw: str, lo: int, hi: int, grammar: str) -> int:
    if not ascii_digits(raw):
        raise _refuse(name, raw, grammar)
    # Past 19 digits it is out of any range here (and int() refuses past 4300 digits).
    n = int(raw) if len(raw) <= 19 else hi + 1
    if not lo <= n <= hi:
        raise _refuse(name, raw, grammar, "out of range")
    return n


def parse_admit_coalesce_ms(raw: str | None) -> int | str | None:
    """off | auto | N ms with 1 <= N <= 2000. Unset, empty, 0 and off (any case) mean admit on
    sight; auto is the priced door (engine/door.py)."""
    if raw is None or raw.lower() in OFF_WORDS:
        return None
    if raw.lower() == "auto":
        return "auto"
    return _int_in("ADMIT_COALESCE_MS", raw, 1, 2000, DOOR_GRAMMAR)


def parse_off_or_int(name: str, raw: str | None, lo: int, hi: int) -> int | None:
    if raw is None or raw.lower() in OFF_WORDS:
        return None
    return _int_in(name, raw, lo, hi, f"off | N, {lo} <= N <= {hi}")


def parse_kv_cache_mb(raw: str | None) -> int | str | None:
    """auto (unset) | off | N MiB: "auto" is settled against the RAM at load (assemble.py)."""
    if raw is None or raw.lower() == "auto":
        return "auto"
    if raw.lower() in OFF_WORDS:
        return None
    return _int_in("KV_CACHE_MB", raw, 1, 1 << 20, "auto | off | N MiB, 1 <= N <= 1048576")


def parse_mix_chunk_tokens(raw: str | None, max_context: int) -> int | None:
    """off | 64 <= N < MAX_CONTEXT; N >= 128 rounds down to a multiple of 128 (whole GEMM tiles)."""
    if raw is None or raw.lower() in OFF_WORDS:
        return None
    n = _int_in("MIX_CHUNK_TOKENS", raw, 64, max_context - 1, f"off | N, 64 <= N < MAX_CONTEXT ({max_context})")
    return n if n < 128 else n // 128 * 128


def parse_default_max_tokens(raw: str | None, max_context: int | None) -> int | None:
    """context | N: max_tokens for a request that sets none (None: the rest of the context)."""
    hi = max_context or 1 << 20
    if raw is None or raw == "":
        return min(DEFAULT_MAX_TOKENS, hi)
    if raw.lower() == "context":
        return None
    return _int_in("DEFAULT_MAX_TOKENS", raw, 1, hi, f"context | N, 1 <= N <= MAX_CONTEXT ({hi})")


def parse_itl_target_ms(raw: str | None) -> int | str | None:
    """off | auto | N ms with 1 <= N <= 10000: the step time each walk round's prompt rows are
    priced to (engine/step_cost.py); auto: a multiple of the live batch's own predicted decode
    step (`step_cost.AUTO_FACTOR`), so the target follows the batch depth and the CPU. `auto` by
    default (why: `resolve`; docs/knobs.md)."""
    if raw is None or raw.lower() in OFF_WORDS:
        return None
    if raw.lower() == "auto":
        return "auto"
    return _int_in("ITL_TARGET_MS", raw, 1, 10000, ITL_TARGET_GRAMMAR)


def parse_ttft_target_ms(raw: str | None) -> int | None:
    """off | N ms with 100 <= N <= 600000: under an inter-token target, a walk round takes at least
    the prompt rows that clear the waiting prompts (walkers' rest + the queue's) within N ms at
    the predicted step time (engine/step_cost.py). Off: the inter-token target alone decides."""
    if raw is None or raw.lower() in OFF_WORDS:
        return None
    return _int_in("TTFT_TARGET_MS", raw, 100, 600000, TTFT_TARGET_GRAMMAR)


def usable_cores() -> int:
    """The cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_async_prefill(raw: str | None, cores: int) -> str | None:
    """The side lane: off, the seed's CUDA lanes (`shared`, `green:NN`) or ours, `cpu:N` (a worker
    with its own budget of N threads; the engine thread keeps the other cores while it runs).
    Returns None (off) or the normalised value; everything else refuses."""
    if raw is None or raw.lower() in OFF_WORDS + ("false",):
        return None
    v = raw.lower()
    kind, _, arg = v.partition(":")
    if v == "shared":
        return v
    if kind == "cpu" and arg and cores < 2:
        raise _refuse("ASYNC_PREFILL", raw, LANE_GRAMMAR, "needs at least 2 cores (this process has 1)")
    hi = {"green": 99, "cpu": cores - 1}.get(kind)
    if hi is None or not ascii_digits(arg) or len(arg) > 19:
        raise _refuse("ASYNC_PREFILL", raw, LANE_GRAMMAR)
    if not 1 <= int(arg) <= hi:
        raise _refuse("ASYNC_PREFILL", raw, LANE_GRAMMAR.replace("cores", str(cores)), "out of range")
    return f"{kind}:{int(arg)}"


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    grammar: str
    doc: str


def _knob(name: str) -> Knob:
    f = Settings.model_fields[name]
    return Knob(name.upper(), f.json_schema_extra["default"], f.json_schema_extra["grammar"], f.description)


KNOBS = tuple(_knob(n) for n in KNOB_FIELDS)  # the table, from the one declaration (settings.Settings)
KNOB_NAMES = tuple(k.name for k in KNOBS)


@dataclass(frozen=True)
class ServingConfig:
    max_context: int | None = None  # None: resolved against the model at load
    decode_slots: int = 16
    mix_gather_rows: int = 512
    mix_max_prompts: int = 4
    mix_chunk_tokens: int | None = None
    async_prefill: str | None = None
    prefix_cache: int | None = None
    admit_coalesce_ms: int | str | None = None  # ms, "auto" or None (off)
    kv_cache_mb: int | str | None = "auto"  # MiB, "auto" (settled against RAM at load) or None (off)
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: the rest of the context
    # ms each walk round's predicted step time stays within (None: off). With a target,
    # mix_chunk_tokens is the explicit cap on a round, and None there means uncapped, not walk off.
    itl_target_ms: int | str | None = None  # N ms, "auto", or None (off)
    ttft_target_ms: int | None = None  # under itl_target_ms: clear the waiting prompts within N ms (None: off)

    def with_model_limit(self, model_max: int) -> "ServingConfig":
        """Settle MAX_CONTEXT against the model (after its metadata is read, before weights are cast)."""
        from dataclasses import replace

        if self.max_context is None:
            return replace(self, max_context=min(4096, model_max))
        if self.max_context > model_max:
            raise KnobError(
                f"{PREFIX}MAX_CONTEXT={self.max_context} exceeds the model's {model_max} positions "
                f"(accepted: N, 64 <= N <= {model_max})"
            )
        return self


def env_lookup(cli: dict[str, str | None] | None = None, environ=None) -> Callable[[str], str | None]:
    """CLI value first, then TAILGATE_<NAME> from the environment."""
    environ = os.environ if environ is None else environ
    cli = cli or {}

    def lookup(name: str) -> str | None:
        v = cli.get(name)
        return v if v is not None else environ.get(PREFIX + name)

    return lookup


def resolve(
    lookup: Callable[[str], str | None], cores: int | None = None, lanes: tuple[str, ...] = ("cpu",)
) -> ServingConfig:
    """Every knob parsed and cross-checked; `cores` (default: this process's) bounds the lane;
    `lanes` are the lane kinds the caller can run (the simulator also prices `green:NN`). A
    refusal names each knob where it was given (`lookup.source`: a flag, an env var, a config
    file's key), so a user is never told of an env var they did not set (issue 44)."""
    try:
        return _resolve(lookup, cores, lanes)
    except KnobError as e:
        source = getattr(lookup, "source", None)
        if source is None:
            raise
        msg = re.sub(rf"\b{PREFIX}({'|'.join(KNOB_NAMES)})\b", lambda m: source(m.group(1)), str(e))
        raise KnobError(msg) from None


def _resolve(lookup: Callable[[str], str | None], cores: int | None, lanes: tuple[str, ...]) -> ServingConfig:
    raw = {name: lookup(name) for name in KNOB_NAMES}

    def present(name):  # "" is unset; whitespace is a value, and refuses like any other non-number
        return raw[name] not in (None, "")

    max_context = (
        _int_in("MAX_CONTEXT", raw["MAX_CONTEXT"], 64, 1 << 20, "N, 64 <= N <= model's max positions")
        if present("MAX_CONTEXT")
        else None
    )
    slots = _int_in("DECODE_SLOTS", raw["DECODE_SLOTS"], 1, 256, "N, 1 <= N <= 256") if present("DECODE_SLOTS") else 16
    ceiling = max_context or 1 << 20
    gather = (
        _int_in("MIX_GATHER_ROWS", raw["MIX_GATHER_ROWS"], 1, ceiling, "N, 1 <= N <= MAX_CONTEXT")
        if present("MIX_GATHER_ROWS")
        else 512
    )
    prompts = (
        _int_in("MIX_MAX_PROMPTS", raw["MIX_MAX_PROMPTS"], 1, slots, f"N, 1 <= N <= DECODE_SLOTS ({slots})")
        if present("MIX_MAX_PROMPTS")
        else min(4, slots)
    )
    # The walk is on by default at 64 rows. AMD EPYC, 256/64 closed loop c4/c8/c16, one run with
    # vLLM beside it: 64-row rounds cut ITL p99 to 376/328/491 ms from 691/721/864 at 256 rows
    # (vLLM 232/303/1223) for -14 %/-6 %/0 % output tok/s, still 1.6/1.4/1.5x vLLM's
    # (docs/benchmarks/walk-amd.md). Off where the ceiling is too small.
    default_chunk = str(DEFAULT_CHUNK) if (max_context or 4096) > DEFAULT_CHUNK else "off"
    chunk = parse_mix_chunk_tokens(
        raw["MIX_CHUNK_TOKENS"] if present("MIX_CHUNK_TOKENS") else default_chunk, max_context or 4096
    )
    lane = parse_async_prefill(raw["ASYNC_PREFILL"], usable_cores() if cores is None else cores)
    cache = parse_off_or_int("PREFIX_CACHE", raw["PREFIX_CACHE"], 1, 1024)
    door = parse_admit_coalesce_ms(raw["ADMIT_COALESCE_MS"])
    kv_mb = parse_kv_cache_mb(raw["KV_CACHE_MB"])
    max_out = parse_default_max_tokens(raw["DEFAULT_MAX_TOKENS"], max_context)
    # The inter-token target's default (DEFAULT_ITL_TARGET) applies only where nothing asked for
    # another admission shape: an explicit MIX_CHUNK_TOKENS (a fixed walk width, or off) or a side
    # lane keeps it off unless ITL_TARGET_MS is given too. The default is off (the 64-row walk)
    # since issue 42 judged `auto` where users feel it: AMD EPYC Zen 5, W-std, vLLM's client, two
    # alternated rounds (docs/benchmarks/socket-tail.md): tok/s 0.99 / 1.00 / 0.99x the walk's and
    # ITL p99 0.88 / 0.93 / 0.95x at c4 / c8 / c16, but TTFT p50 1.78x at c16 (1.02x and 2.65x),
    # past the 1.25x bound, so the default is the walk until `auto` holds it on every class
    # (on the Intel Xeon with AMX, same rounds, `auto` held them all: tok/s 0.99-1.06x, ITL p99
    # 0.89-0.97x, TTFT p50 0.92-1.00x). Why `auto`
    # had been the default (with TTFT_TARGET_MS's 2 s
    # horizon): AMD EPYC Zen 3, 256 / 64 closed loop, one run beside the fixed 64-row walk, vLLM and
    # llama.cpp (docs/benchmarks/itl-target-amd.md): output tok/s 46.7 / 64.9 / 61.8 at c4 / c8 / c16
    # against the walk's 44.6 / 49.3 / 55.5, ITL p99 152 / 157 / 392 ms against 226 / 288 / 373, for
    # TTFT p50 1.3 / 1.6 / 1.9 s against 1.0 / 1.1 / 1.4 s (vLLM: 4.6 / 8.4 s at c4 / c8). Without the
    # horizon `auto` moved the wait to the queue (TTFT p50 13.3 s at c16 in the run before).
    default_target = (
        "off" if present("MIX_CHUNK_TOKENS") or present("ASYNC_PREFILL") or chunk is None else DEFAULT_ITL_TARGET
    )
    target = parse_itl_target_ms(raw["ITL_TARGET_MS"] if present("ITL_TARGET_MS") else default_target)
    # Cross-knob rules, in one place.
    if door is not None and lane is not None:
        raise KnobError(
            f"{PREFIX}ADMIT_COALESCE_MS={raw['ADMIT_COALESCE_MS']!r} refuses with "
            f"{PREFIX}ASYNC_PREFILL={raw['ASYNC_PREFILL']!r}: the lane flies one prefill at a time, "
            "so the door could only delay it"
        )
    if lane is not None and lane.split(":")[0] not in lanes:
        # The seed's lanes are CUDA streams (green: capped to ~NN % of the SMs); tailgate's CUDA
        # path has no second stream, so they refuse everywhere rather than run as something else.
        raise KnobError(
            f"{PREFIX}ASYNC_PREFILL={raw['ASYNC_PREFILL']!r}: the {lane.split(':')[0]} lane is a CUDA "
            "stream, which tailgate does not build (accepted here: off | " + " | ".join(f"{k}:N" for k in lanes) + ")"
        )
    if target is not None:
        # The target prices walk rounds, so it needs the walk: it turns it on, and MIX_CHUNK_TOKENS
        # becomes a cap on every round, kept only when given (unset: uncapped, the target decides).
        if present("MIX_CHUNK_TOKENS") and chunk is None:
            raise KnobError(
                f"{PREFIX}ITL_TARGET_MS={raw['ITL_TARGET_MS']!r} refuses with "
                f"{PREFIX}MIX_CHUNK_TOKENS={raw['MIX_CHUNK_TOKENS']!r}: the target prices walk rounds, "
                "and the walk is off (unset MIX_CHUNK_TOKENS for uncapped rounds, or give a cap)"
            )
        if lane is not None:
            raise KnobError(
                f"{PREFIX}ITL_TARGET_MS={raw['ITL_TARGET_MS']!r} refuses with "
                f"{PREFIX}ASYNC_PREFILL={raw['ASYNC_PREFILL']!r}: the lane prefills every admission "
                "into a live batch beside it, so no walk round the target prices would carry live rows"
            )
        # Unset, an absolute target's rounds are uncapped (the target decides); `auto`'s are capped
        # at the walk's own width: it narrows the walk where live rows ride, never widens it
        # (engine/step_cost.py AUTO_FACTOR: judged on three CPU classes' measured costs).
        if not present("MIX_CHUNK_TOKENS") and target != "auto":
            chunk = None  # (under auto, unset keeps the default walk's width parsed above)
    # Unset, the TTFT horizon is on under `auto` and off under an absolute target: N ms is a tail
    # budget the user chose, and in a saturated loop the horizon widens every round past it (Llama
    # 3.2 3B's shape, AMD EPYC Zen 5, W-std c8, `tailgate sim --cost llama3.2-3b-zen5-measured`:
    # targets of 150-250 ms all gave ITL p99 439-442 ms with the 2 s horizon, the target's own
    # ~200 ms without; real, 115 ms without it, two rounds: ITL p99 134 ms against vLLM's 443-467,
    # docs/benchmarks/sizes.md). Asked for beside N, the horizon widens as it does under `auto`.
    ttft_default = DEFAULT_TTFT_TARGET if target == "auto" else "off"
    ttft = parse_ttft_target_ms(raw["TTFT_TARGET_MS"] if present("TTFT_TARGET_MS") else ttft_default)
    if target is None:
        if present("TTFT_TARGET_MS") and ttft is not None and (chunk is None or lane is not None):
            raise KnobError(
                f"{PREFIX}TTFT_TARGET_MS={raw['TTFT_TARGET_MS']!r} refuses without the walk: it "
                "widens walk rounds, and "
                + (
                    f"{PREFIX}ASYNC_PREFILL={raw['ASYNC_PREFILL']!r} prefills on the side lane"
                    if lane
                    else "the walk is off"
                )
            )
        if not present("TTFT_TARGET_MS"):
            # The default walk widens under a backlog (engine/step_cost.py WIDEN_S says how far) unless
            # a width was asked for, which stays fixed. 500 ms: the AMX Xeon, gamma arrivals (60
            # requests, 1.5 req/s): the 64-row walk's TTFT p99 737 ms, vLLM's 407-553; a 1000 ms horizon
            # barely moved it (714-777 ms). In the simulator's measured presets (three classes, three
            # seeds) 500 ms kept W-std c4 / c8 ITL p99 within 1.02x the walk's and cost c16 1.4-2.0x
            # on Zen 5 / AMX, still below vLLM's there (docs/benchmarks/socket-tail.md).
            fixed = present("MIX_CHUNK_TOKENS") or lane is not None or chunk is None
            ttft = None if fixed else parse_ttft_target_ms(DEFAULT_WALK_TTFT)
    return ServingConfig(max_context, slots, gather, prompts, chunk, lane, cache, door, kv_mb, max_out, target, ttft)


# vLLM's names for the knobs that mean the same here (issue 44: a vLLM user's flags just work).
VLLM_ALIASES = {"MAX_CONTEXT": "--max-model-len", "DECODE_SLOTS": "--max-num-seqs"}
# --enable-prefix-caching: vLLM's cache is bounded by its pages alone; K = the grammar's most
# prompts remembered is the nearest (cached pages pin nothing here either: engine/prefix.py).
PREFIX_CACHE_ON = "1024"


def flag(name: str) -> str:
    """A knob's (or setting's) command-line flag: `MAX_CONTEXT` -> `--max-context`."""
    return "--" + name.lower().replace("_", "-")


def add_knob_args(parser) -> None:
    """One --flag per knob (dest `knob_<NAME>`), for every command that runs the scheduler, with
    vLLM's spelling beside ours where the meaning is the same."""
    for k in KNOBS:
        flags = [flag(k.name)] + ([VLLM_ALIASES[k.name]] if k.name in VLLM_ALIASES else [])
        parser.add_argument(
            *flags,
            dest="knob_" + k.name,
            default=None,
            help=f"{k.doc} [{k.grammar}; default {k.default}; env {PREFIX}{k.name}]",
        )
    parser.add_argument(
        "--enable-prefix-caching",
        dest="knob_PREFIX_CACHE",
        action="store_const",
        const=PREFIX_CACHE_ON,
        help=f"vLLM's flag: the same as --prefix-cache {PREFIX_CACHE_ON}",
    )
    parser.add_argument(
        "--no-enable-prefix-caching",
        dest="knob_PREFIX_CACHE",
        action="store_const",
        const="off",
        help="vLLM's flag: the same as --prefix-cache off",
    )


def cli_lookup(args) -> Callable[[str], str | None]:
    """The knobs' lookup for parsed `add_knob_args` flags: the flag, then the environment (for
    `serve`, server/settings.py `apply` has already put each knob's value from its flag, env var
    or config file on the flag's place, and noted where it came from: `lookup.source`)."""
    lookup = env_lookup({name: getattr(args, "knob_" + name) for name in KNOB_NAMES})
    given = getattr(args, "knob_sources", None)
    if given is None:  # not through settings.apply: a set flag is named as the flag
        given = {n: flag(n) for n in KNOB_NAMES if getattr(args, "knob_" + n) is not None}
    lookup.source = lambda name: given.get(name, PREFIX + name)
    return lookup


def knob_table_markdown() -> str:
    rows = ["| env var / flag | default | grammar | what it does |", "|---|---|---|---|"]
    for k in KNOBS:
        esc = lambda t: t.replace("|", "\\|")  # noqa: E731
        rows.append(f"| `{PREFIX}{k.name}` / `{flag(k.name)}` | {esc(k.default)} | {esc(k.grammar)} | {esc(k.doc)} |")
    return "\n".join(rows)
