"""Log lines: `--log-format text` (the default) or `json` (one object per line, for log shippers),
and the access line every finished generation request writes (request id, status, tokens, timings).
"""

from __future__ import annotations

import json
import logging
import os
import time

access = logging.getLogger("tailgate.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, `fields` (a fleet replica's id),
    and an access line's fields."""

    def __init__(self, fields: dict | None = None):
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **self.fields,
        }
        fields = getattr(record, "access", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str, fields: dict | None = None, stream=None) -> None:
    """The root logger's handler for this process (uvicorn's loggers propagate to it in json mode;
    in text mode uvicorn keeps its own format, as before). `fields`: added to every JSON line;
    `stream`: where lines go (stderr by default)."""
    handler = logging.StreamHandler(stream)
    if fmt == "json":
        # tqdm's own switch (read by model/ at each bar): a progress bar's plain text between the
        # JSON lines would break every line-by-line reader of stderr (issue 44)
        os.environ["TQDM_DISABLE"] = "1"
        handler.setFormatter(JsonFormatter(fields))
        handler.formatter.converter = time.gmtime
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), 5 if level == "trace" else logging.INFO))


def log_request(gen, method: str, path: str, status: int, started: float) -> None:
    """The access line of one generation request, when it has ended (answered, streamed out, or
    left by its client: 499)."""
    now = time.monotonic()
    firsts = [c.first_at for c in gen.choices if c.first_at is not None]
    u = gen.usage()
    fields = {
        "request_id": gen.id,
        "method": method,
        "path": path,
        "status": status,
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["completion_tokens"],
        "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
        "finish_reasons": [c.finish for c in gen.choices],
        "stream": bool(gen.g.stream),
        # engine clock = time.monotonic (engine/loop.py): first token against arrival
        "ttft_s": round(min(firsts) - min(c.req.arrival for c in gen.choices), 4) if firsts else None,
        "e2e_s": round(now - started, 4),
    }
    access.info(
        "%s %s %d %s prompt=%d completion=%d cached=%d ttft=%s e2e=%.3fs",
        method,
        path,
        status,
        gen.id,
        fields["prompt_tokens"],
        fields["completion_tokens"],
        fields["cached_tokens"],
        "-" if fields["ttft_s"] is None else f"{fields['ttft_s']:.3f}s",
        fields["e2e_s"],
        extra={"access": fields},
    )
