"""Start-up progress bars (tqdm on stderr), off under `TQDM_DISABLE`: `--log-format json` sets it
(server/logs.py), since a bar's plain text between JSON lines breaks every line-by-line reader.
tqdm reads its TQDM_ variables once, at import, which is before the log format is known: so the
switch is read here, at each bar."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def bar(iterable=None, *, disable: bool = False, **kw) -> tqdm:
    return tqdm(iterable, file=sys.stderr, disable=disable or bool(os.environ.get("TQDM_DISABLE")), **kw)
