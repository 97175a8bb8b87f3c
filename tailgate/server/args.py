"""`tailgate serve`'s flags, apart from the server so every CLI command can build its parser
without importing torch or the web stack (`tailgate sim` started in 2.3 s, 1.9 of them imports)."""

from __future__ import annotations

import argparse

from ..settings import ascii_digits


def uint_arg(lo: int = 0, hi: int | None = None):
    """An argparse type for an integer flag, read as the knobs are (config.ascii_digits): ASCII
    digits only, no sign, '_' or whitespace, within [lo, hi]."""
    grammar = f"N, {lo} <= N" + (f" <= {hi}" if hi is not None else "") + ", ASCII digits only"

    def parse(raw: str) -> int:
        if not ascii_digits(raw):
            raise argparse.ArgumentTypeError(f"{raw!r} not recognized (accepted: {grammar})")
        n = int(raw) if len(raw) <= 19 else 1 << 64
        if n < lo or (hi is not None and n > hi) or n >= 1 << 64:
            raise argparse.ArgumentTypeError(f"{raw!r} out of range (accepted: {grammar})")
        return n

    return parse


def _int_type(field):
    """An integer setting's flag refuses at parse time, as every integer flag does (uint_arg: what
    int() would forgive, ' 80' or '1_000', is refused naming the flag); others parse as text and
    are checked once by the settings model."""
    if field.annotation is not int:
        return None
    lo = next((m.ge for m in field.metadata if hasattr(m, "ge")), 0)
    hi = next((m.le for m in field.metadata if hasattr(m, "le")), None)
    return uint_arg(lo, None if hi is None or hi >= (1 << 63) - 1 else hi)


def add_serve_args(p) -> None:
    """`serve`'s flags, one per field of the one declaration (tailgate/settings.py `Settings`: its
    descriptions are the help): the server's settings here, the scheduler's knobs by
    config.add_knob_args (the flags every command that runs the scheduler has).
    Every server flag is left unset here (None), so settings.apply sees which were given and
    resolves each against TAILGATE_<NAME> and --config; its values are checked there, once."""
    from ..config import add_knob_args
    from ..settings import Settings
    from .settings import FIELDS, grammar

    fleet = p.add_argument_group("fleet (tailgate/fleet/; needs the ray extra: pip install .[ray])")
    for name in FIELDS:
        f = Settings.model_fields[name]
        flag = "--" + name.replace("_", "-")
        if flag in p._option_string_actions:  # the model's flags, added by cli.py for every command
            continue
        where = fleet if name in ("replicas", "ray_address", "router") else p
        default = f.default if f.default is None or isinstance(f.default, str) else str(f.default)
        doc = f.description or ""
        where.add_argument(
            flag, type=_int_type(f), default=None, help=f"{doc}{'; ' if doc else ''}{grammar(name)}; default {default}"
        )
    p.add_argument(
        "--config",
        default=None,
        help="a TOML file of these flags and knobs (keys: their names in lower case with underscores; "
        "or TAILGATE_CONFIG); a flag, then a TAILGATE_<NAME> env var, wins over it",
    )
    add_knob_args(p)
    for a in p._actions:  # the model's flags too: unset until settings.apply resolves them
        if a.dest not in ("help", "config") and not a.dest.startswith("knob_"):
            a.default = None
