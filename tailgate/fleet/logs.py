"""The fleet's log lines in the command's own output (issue 44 item 5).

Each replica logs as one server does (`server/logs.configure`: the access lines, INFO and up, text
or JSON; a JSON line carries the replica's id), to its stderr, which Ray carries to this process.
Ray's driver prints each worker's line (a replica's, Serve's controller's) and each error Ray
publishes (a worker that died) behind a `(name pid=N)` prefix, and folds lines that look alike
from different workers into one "[repeated Nx across cluster]" line later: under `--log-format
json` neither is a JSON line, and the folding hides one replica's access lines behind the
other's. So Ray's folding is off for the fleet (`RAY_DEDUP_LOGS=0`, set before Ray is imported),
and under json the driver prints every such line as one JSON object: a line that is one already
(a replica's own) as it is, any other (Serve's text, the raylet's) wrapped, its worker named in
`source`."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

from ..server.logs import JsonFormatter

LEVEL = re.compile(r"^\W*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def as_json(line: str, source: str) -> str:
    """`line` if it is a JSON object, else one that holds it (its level read from its start)."""
    text = ANSI.sub("", line).rstrip("\r\n")
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):  # one line, even if it came spread over several
            return text if "\n" not in text else json.dumps(obj, ensure_ascii=False)
    except ValueError:
        pass
    m = LEVEL.match(text)
    fmt = JsonFormatter({"source": source})  # a server's own JSON line, its worker named
    fmt.converter = time.gmtime
    return fmt.format(
        logging.LogRecord("ray", getattr(logging, m.group(1)) if m else logging.INFO, "", 0, text, None, None)
    )


def print_batch(data: dict) -> None:
    """One batch of a worker's lines as Ray's log monitor sends it (`lines`, `pid`, `actor_name`
    or `task_name`, `is_err`), each line one JSON line on the stream Ray would print it to."""
    name = data.get("actor_name") or data.get("task_name") or ""
    source = f"{name} pid={data.get('pid')}".strip()
    out = sys.stderr if data.get("is_err") else sys.stdout
    lines = data.get("lines", [])
    if data.get("pid") == "autoscaler":  # its events only, as Ray's printer keeps (not its status every 5 s)
        from ray._private.worker import filter_autoscaler_events

        lines = list(filter_autoscaler_events(lines))
    lines = [as_json(x, source) for x in lines if x.strip()]
    if lines:
        out.write("".join(x + "\n" for x in lines))
        out.flush()


def json_worker_lines() -> bool:
    """Before ray.init: the driver prints workers' lines, and the errors Ray publishes (a worker
    that died: "(raylet) A worker died or was killed ..."), through `print_batch` instead of its
    own prefixed printer: both reach `ray._private.worker.print_to_stdstream`, which ray.init binds
    as its printer. False (Ray's printer kept) where this Ray has no such function."""
    try:
        import ray._private.worker as ray_worker
    except ImportError:
        return False
    if not callable(getattr(ray_worker, "print_to_stdstream", None)):
        return False
    ray_worker.print_to_stdstream = lambda data, ignore_prefix=False: print_batch(data)
    return True
