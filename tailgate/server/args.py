"""`tailgate serve`'s flags, apart from the server so every CLI command can build its parser
without importing torch or the web stack (`tailgate sim` started in 2.3 s, 1.9 of them imports)."""
from __future__ import annotations

import argparse


def _positive_int(raw: str) -> int:
    if not raw.strip().isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer >= 1")
    return int(raw)


def add_serve_args(p) -> None:
    from ..config import add_knob_args

    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on every /v1 route "
                   "(or set TAILGATE_API_KEY, which `ps` does not show)")
    p.add_argument("--allowed-hosts", default=None, help="comma-separated Host names to answer besides loopback "
                   "ones (a loopback server answers only those by default; `*`: any)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-queued-requests", type=int, default=256, help="429 beyond this many waiting requests")
    p.add_argument("--max-queued-tokens", type=int, default=1 << 20, help="429 beyond this many waiting prompt tokens")
    p.add_argument("--max-body-mb", type=_positive_int, default=8, help="413 for request bodies past this many MiB")
    p.add_argument("--drain-timeout", type=int, default=30, help="seconds SIGTERM waits for in-flight requests")
    p.add_argument("--log-level", default="info")
    add_knob_args(p)
