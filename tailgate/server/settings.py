"""`tailgate serve`'s settings: one pydantic-settings model read from, in order of precedence, the
command line, `TAILGATE_<NAME>` environment variables, and a TOML config file (`--config FILE` or
`TAILGATE_CONFIG`; keys are the flags' names with underscores), then the defaults here.

The scheduler's knobs (config.py) keep their own table and reader (flag, then `TAILGATE_<NAME>`,
then the config file's key: the knob's name in lower case, `max_context = 8192`); this model is
the server's flags, and the one file holds both. Integers are read as the knobs are (ASCII digits only), and a value that does not parse
refuses the start before any weights load, naming where it came from, the value and the grammar.
"""

from __future__ import annotations

import os
import tomllib
from typing import Annotated, Literal, get_origin

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from ..config import KNOB_NAMES, PREFIX, ascii_digits


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


KEEP_ALIVE_GRAMMAR = "off | N, 1 <= N <= 3600 (seconds)"


class ServeSettings(BaseSettings):
    """The one declaration of `tailgate serve`'s settings: each field is a flag (`--name-with-dashes`,
    server/args.py builds them from here, its description the help), an env var
    `TAILGATE_<NAME>` and a `--config` TOML key. The scheduler's knobs are the other table
    (config.py KNOBS), from which their flags, env vars and TOML keys come the same way."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", case_sensitive=False)

    # The model's flags (cli.py adds them to every command that loads one; these read them for serve).
    model: str = "gemma3-270m"
    gguf_file: str | None = None  # which GGUF file of a hub id or a directory holding several
    dtype: str = "auto"  # these three are checked where they are used (model/kernels.py's choose)
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

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file = settings_cls.model_config.get("file_values")  # the config file's server keys (`load`)
        return (init_settings, env_settings) + ((InitSettingsSource(settings_cls, file),) if file else ())


FIELDS = tuple(ServeSettings.model_fields)


KNOB_KEYS = tuple(k.lower() for k in KNOB_NAMES)  # the scheduler's knobs, as config file keys


class SettingsError(ValueError):
    pass


def read_file(config: str) -> tuple[dict, dict]:
    """A TOML config file's (server settings by field name, scheduler knobs by knob name as
    strings, the form their grammar reads)."""
    if not os.path.isfile(config):
        raise SettingsError(f"config file {config!r} not found")
    try:
        with open(config, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"config file {config!r}: {e}") from None
    server, knobs = {}, {}
    for k, v in data.items():
        if k in KNOB_KEYS:
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise SettingsError(f"{config}: {k} = {v!r}: a knob is a string or an integer")
            knobs[k.upper()] = str(v)
        else:
            server[k] = v
    return server, knobs


def load(cli: dict, config: str | None = None) -> tuple[ServeSettings, dict]:
    """The settings from `cli` (flag values given, by field name), the environment and the config
    file, and the file's scheduler knobs (by knob name; config.resolve reads them beneath flags
    and env vars); SettingsError naming the first bad value's source, value and grammar."""
    environ = os.environ
    config = config or environ.get(PREFIX + "CONFIG") or None
    file_values, knobs = read_file(config) if config is not None else ({}, {})
    given = {k: v for k, v in cli.items() if v is not None}

    class Resolved(ServeSettings):  # the file's values ride the class config (pydantic-settings' way)
        model_config = {**ServeSettings.model_config, "file_values": file_values}

    try:
        return Resolved(**given), knobs
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        raise SettingsError(
            _where(name, given, environ, config, err.get("input")) + f" not recognized (accepted: {grammar(name)})"
            if name in FIELDS
            else f"{config or 'settings'}: unknown setting {name!r} (known: {', '.join(FIELDS + KNOB_KEYS)})"
        ) from None


def _where(name: str, given: dict, environ, config, value=None) -> str:
    if name in given:
        return f"--{name.replace('_', '-')}={given[name]!r}"
    env = next((k for k in environ if k.upper() == PREFIX + name.upper()), None)
    if env is not None:
        return f"{env}={environ[env]!r}"
    return f"{config}: {name} = {value!r}"


def grammar(name: str) -> str:
    """What field `name` accepts, in the knobs' words (its flag's help and its refusals say it)."""
    f = ServeSettings.model_fields[name]
    extra = f.json_schema_extra or {}
    for m in f.metadata:
        extra = extra or getattr(m, "json_schema_extra", None) or {}
    if "grammar" in extra:
        return extra["grammar"]
    words, ann = [], f.annotation
    for a in (ann,) if get_origin(ann) is Literal else getattr(ann, "__args__", ()) or (ann,):
        if get_origin(a) is Literal:
            words += a.__args__
        elif a is str:
            words.append("a string")
        elif a is bool:
            words.append("true | false")
    return " | ".join(words) or "a string"


def apply(args) -> ServeSettings:
    """Resolve the settings for parsed `serve` flags (unset ones are None, see args.py) and write
    them back onto `args`, so everything downstream reads one resolved value."""
    s, knobs = load({k: getattr(args, k, None) for k in FIELDS}, config=getattr(args, "config", None))
    for k in FIELDS:
        setattr(args, k, getattr(s, k))
    args.knob_file = knobs  # the config file's knobs: config.cli_lookup reads them last
    return s
