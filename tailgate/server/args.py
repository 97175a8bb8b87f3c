"""`tailgate serve`'s flags, apart from the server so every CLI command can build its parser
without importing torch or the web stack (`tailgate sim` started in 2.3 s, 1.9 of them imports)."""

from __future__ import annotations

import argparse

from ..config import ascii_digits


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


def add_serve_args(p) -> None:
    from ..config import add_knob_args

    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=uint_arg(0, 65535), default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every /v1 route "
        "(or set TAILGATE_API_KEY, which `ps` does not show)",
    )
    p.add_argument(
        "--allowed-hosts",
        default=None,
        help="comma-separated Host names to answer besides loopback "
        "ones (a loopback server answers only those by default; `*`: any)",
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument(
        "--chat-template",
        default=None,
        help="serve this chat template instead of the model's: a file, "
        "or the template itself (as vLLM reads it; or set TAILGATE_CHAT_TEMPLATE)",
    )
    p.add_argument("--max-queued-requests", type=uint_arg(), default=256, help="429 beyond this many waiting requests")
    p.add_argument(
        "--max-queued-tokens", type=uint_arg(), default=1 << 20, help="429 beyond this many waiting prompt tokens"
    )
    p.add_argument("--max-body-mb", type=uint_arg(1), default=8, help="413 for request bodies past this many MiB")
    p.add_argument("--drain-timeout", type=uint_arg(), default=30, help="seconds SIGTERM waits for in-flight requests")
    p.add_argument("--log-level", default="info", help="critical | error | warning | info | debug | trace")
    p.add_argument(
        "--log-format",
        default="text",
        help="text | json (one object a line); either way one access "
        "line per finished generation request: id, status, tokens, TTFT, end-to-end",
    )
    p.add_argument(
        "--allowed-origins",
        default=None,
        help="comma-separated browser origins answered cross-origin (CORS, with preflight; off by default; `*`: any)",
    )
    p.add_argument(
        "--sse-keep-alive",
        default="15",
        help="off | N, 1 <= N <= 3600: a `: keep-alive` comment on a "
        "stream silent N seconds (queued behind others, or a long step)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="a TOML file of these flags (keys: their names with underscores; "
        "or TAILGATE_CONFIG); a flag, then a TAILGATE_<NAME> env var, wins over it",
    )
    add_knob_args(p)
    # The fleet (tailgate/fleet/, docs/scale-out.md): N > 1 runs N engine replicas on Ray Serve, the
    # `ray` extra; with N = 1 nothing of Ray is imported.
    fl = p.add_argument_group("fleet (tailgate/fleet/; needs the ray extra: pip install .[ray])")
    fl.add_argument(
        "--replicas",
        type=uint_arg(1),
        default=1,
        help="engine replicas behind this endpoint, each with cores/N threads and its own KV cache (N > 1: Ray Serve)",
    )
    fl.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (default: start a local one, stopped with the command)",
    )
    fl.add_argument(
        "--router",
        default=None,
        choices=["prefix", "least-loaded", "random", "pow2"],
        help="how a request picks its replica (default prefix: longest cached prefix unless "
        "out of balance; pow2: Ray Serve's own power-of-two choices)",
    )
    # Every flag above (and the model's, added before) is a server setting that TAILGATE_<NAME> and
    # --config can give too (server/settings.py resolves them): unset here, so a given flag is seen.
    for a in p._actions:
        if a.dest not in ("help", "config") and not a.dest.startswith("knob_"):
            a.default = None
