"""Reading `tailgate serve`'s settings (declared once, `tailgate/settings.py` `Settings`): in order
of precedence the command line, `TAILGATE_<NAME>` environment variables, and a TOML config file
(`--config FILE` or `TAILGATE_CONFIG`; keys are the field names: the flags' names with underscores,
server settings and scheduler knobs alike, `max_context = 8192`), then the defaults. A server
setting that does not parse refuses the start before any weights load, naming where it came from,
the value and the grammar; the knobs' values are parsed and cross-checked by config.resolve.
"""

from __future__ import annotations

import os
import tomllib
from typing import Literal, get_origin

from pydantic import ValidationError

from ..config import flag
from ..settings import KNOB_FIELDS, PREFIX, SERVER_FIELDS, Settings

FIELDS = SERVER_FIELDS  # the server's settings (the knobs: KNOB_FIELDS)


class SettingsError(ValueError):
    pass


def read_file(config: str) -> dict:
    """A TOML config file's values by field name (each checked by `load`, as flags are)."""
    if not os.path.isfile(config):
        raise SettingsError(f"config file {config!r} not found")
    try:
        with open(config, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"config file {config!r}: {e}") from None


# TAILGATE_ variables read outside the settings: the config file's path, the cache directory
# (model/formats/weights.py) and the browser tests' Chromium (tests/browser.py).
ENV_ONLY = ("CONFIG", "CACHE_DIR", "CHROMIUM")


def unknown_env(environ) -> str | None:
    """A refusal for the first TAILGATE_ variable that names no setting (a typo would otherwise
    be ignored without a word), with the nearest known name."""
    import difflib

    known = [PREFIX + n.upper() for n in Settings.model_fields] + [PREFIX + n for n in ENV_ONLY]
    for k in sorted(environ):
        if k.upper().startswith(PREFIX) and k.upper() not in known:
            near = difflib.get_close_matches(k.upper(), known, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            return f"{k} is not a setting ({hint}every setting: tailgate serve --help; unset it to go on)"
    return None


def source(name: str, given: dict, environ, config: str | None) -> str:
    """Where field `name`'s value came from, as a refusal names it: its flag, its env var as set,
    else the config file's key."""
    if given.get(name) is not None:
        return flag(name)
    env = next((k for k in environ if k.upper() == PREFIX + name.upper()), None)
    return env if env is not None else f"{config}: {name}"


def load(cli: dict, config: str | None = None, knob_sources: dict | None = None) -> Settings:
    """The settings from `cli` (flag values given, by field name), the environment and the config
    file; SettingsError naming the first bad value's source, value and grammar. `knob_sources`,
    when given, is filled with where each knob given a value came from (`source`), which
    config.resolve names in a refusal instead of TAILGATE_<NAME>."""
    environ = os.environ
    if (refusal := unknown_env(environ)) is not None:
        raise SettingsError(refusal)
    config = config or environ.get(PREFIX + "CONFIG") or None
    file_values = read_file(config) if config is not None else {}
    given = {k: v for k, v in cli.items() if v is not None}
    if knob_sources is not None:
        env = {k.upper() for k in environ}
        for name in KNOB_FIELDS:
            if name in given or PREFIX + name.upper() in env or name in file_values:
                knob_sources[name.upper()] = source(name, given, environ, config)

    class Resolved(Settings):  # the file's values ride the class config (pydantic-settings' way)
        model_config = {**Settings.model_config, "file_values": file_values}

    try:
        return Resolved(**given)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        if name in KNOB_FIELDS:  # a knob's value is text: only its type can be wrong here
            raise SettingsError(
                f"{_where(name, given, environ, config, err.get('input'))}: {err['msg'].removeprefix('Value error, ')}"
            ) from None
        raise SettingsError(
            _where(name, given, environ, config, err.get("input")) + f" not recognized (accepted: {grammar(name)})"
            if name in FIELDS
            else f"{config or 'settings'}: unknown setting {name!r} (known: {', '.join(Settings.model_fields)})"
        ) from None


def _where(name: str, given: dict, environ, config, value=None) -> str:
    where = source(name, given, environ, config)
    if name in given:
        return f"{where}={given[name]!r}"
    return f"{where}={environ[where]!r}" if where in environ else f"{where} = {value!r}"


def grammar(name: str) -> str:
    """What field `name` accepts, in the knobs' words (its flag's help and its refusals say it)."""
    f = Settings.model_fields[name]
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


def dest(name: str) -> str:
    """Where argparse keeps a field's flag: the field's name; a knob's `knob_<NAME>` (config.py)."""
    return "knob_" + name.upper() if name in KNOB_FIELDS else name


def apply(args) -> Settings:
    """Resolve the settings for parsed `serve` flags (unset ones are None, see args.py) and write
    them back onto `args`, so everything downstream reads one resolved value (the knobs' text
    where config.cli_lookup reads it)."""
    args.knob_sources = {}
    s = load(
        {k: getattr(args, dest(k), None) for k in Settings.model_fields},
        getattr(args, "config", None),
        args.knob_sources,
    )
    for k in Settings.model_fields:
        setattr(args, dest(k), getattr(s, k))
    return s
