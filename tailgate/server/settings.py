"""`tailgate serve`'s settings: one pydantic-settings model read from, in order of precedence, the
command line, `TAILGATE_<NAME>` environment variables, and a TOML config file (`--config FILE` or
`TAILGATE_CONFIG`; keys are the flags' names with underscores), then the defaults here.

The scheduler's knobs (config.py) keep their own table and reader; this model is the server's
flags. Integers are read as the knobs are (ASCII digits only), and a value that does not parse
refuses the start before any weights load, naming where it came from, the value and the grammar.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from ..config import PREFIX, ascii_digits


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
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", case_sensitive=False)

    model: str = "gemma3-270m"
    dtype: str = "auto"  # these three are checked where they are used (model/kernels.py's choose)
    kernels: str = "auto"
    device: str = "auto"
    threads: UInt() = 0
    host: str = "127.0.0.1"
    port: UInt(0, 65535) = 8000
    api_key: str | None = None
    allowed_hosts: str | None = None
    allowed_origins: str | None = None
    served_model_name: str | None = None
    chat_template: str | None = None
    max_queued_requests: UInt() = 256
    max_queued_tokens: UInt() = 1 << 20
    max_body_mb: UInt(1) = 8
    drain_timeout: UInt() = 30
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "info"
    log_format: Literal["text", "json"] = "text"
    # 15 s: under the 30-60 s idle timeouts of common proxies and load balancers (nginx's
    # proxy_read_timeout is 60 s), so a stream queued behind a long batch is not cut.
    sse_keep_alive: Annotated[
        int | None,
        Field(ge=1, le=3600, json_schema_extra={"grammar": KEEP_ALIVE_GRAMMAR}),
        BeforeValidator(_off_or_seconds),
    ] = 15
    replicas: UInt(1) = 1
    ray_address: str | None = None
    router: Literal["prefix", "least-loaded", "random", "pow2"] | None = None

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = settings_cls.model_config.get("toml_file")
        return (init_settings, env_settings) + ((TomlConfigSettingsSource(settings_cls, toml),) if toml else ())


FIELDS = tuple(ServeSettings.model_fields)


class SettingsError(ValueError):
    pass


def load(cli: dict, config: str | None = None) -> ServeSettings:
    """The settings from `cli` (flag values given, by field name), the environment and the config
    file; SettingsError naming the first bad value's source, value and grammar."""
    environ = os.environ
    config = config or environ.get(PREFIX + "CONFIG") or None
    if config is not None and not os.path.isfile(config):
        raise SettingsError(f"config file {config!r} not found")
    given = {k: v for k, v in cli.items() if v is not None}

    class Resolved(ServeSettings):  # the file's path rides the class config (pydantic-settings' way)
        model_config = {**ServeSettings.model_config, "toml_file": config}

    try:
        return Resolved(**given)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        raise SettingsError(
            _where(name, given, environ, config, err.get("input")) + f" not recognized (accepted: {_grammar(name)})"
            if name in FIELDS
            else f"{config or 'settings'}: unknown setting {name!r} (known: {', '.join(FIELDS)})"
        ) from None
    except Exception as e:  # a config file that is not TOML
        raise SettingsError(f"config file {config!r}: {e}") from None


def _where(name: str, given: dict, environ, config, value=None) -> str:
    if name in given:
        return f"--{name.replace('_', '-')}={given[name]!r}"
    env = next((k for k in environ if k.upper() == PREFIX + name.upper()), None)
    if env is not None:
        return f"{env}={environ[env]!r}"
    return f"{config}: {name} = {value!r}"


def _grammar(name: str) -> str:
    f = ServeSettings.model_fields[name]
    extra = f.json_schema_extra or {}
    for m in f.metadata:
        extra = extra or getattr(m, "json_schema_extra", None) or {}
    if "grammar" in extra:
        return extra["grammar"]
    args = getattr(f.annotation, "__args__", ())
    return " | ".join(str(a) for a in args if a is not type(None)) or "a string"


def apply(args) -> ServeSettings:
    """Resolve the settings for parsed `serve` flags (unset ones are None, see args.py) and write
    them back onto `args`, so everything downstream reads one resolved value."""
    s = load({k: getattr(args, k, None) for k in FIELDS}, config=getattr(args, "config", None))
    for k in FIELDS:
        setattr(args, k, getattr(s, k))
    return s
