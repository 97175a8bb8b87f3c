"""The server-wide state every route shares: what is served, its limits, the engine once loaded,
and the latency histograms /metrics reads."""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from dataclasses import dataclass, field

from ..engine.metrics import DELIVERY_BUCKETS, Histogram


@dataclass
class ServerState:
    served_name: str
    api_key: str | None = None
    max_queued_requests: int = 256
    max_queued_tokens: int = 1 << 20
    max_body_bytes: int = 8 << 20  # 413 beyond this: a 4096-token prompt is ~20-40 KB of JSON
    engine: object = None  # set once the model is loaded
    model: object = None
    cfg: object = None
    load_error: str | None = None
    kernels: dict | None = None  # the KernelPlan chosen at start (`/version` shows it)
    allowed_hosts: frozenset | None = None  # Host header names served (None: any; see main.allowed_hosts)
    allowed_origins: tuple = ()  # browser origins CORS lets in (--allowed-origins; empty: CORS off)
    keep_alive_s: float | None = 15  # a `: keep-alive` comment on a stream silent this long (None: never)
    # before each step the engine waits up to this long for the streams to write the last step's
    # tokens (--delivery-wait-ms; engine/loop.py DeliveryFence); 0: it never waits
    delivery_wait_s: float = 0.0
    pending: dict = field(default_factory=dict)  # request id -> prompt tokens, until Scheduled
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)
    # Streams only, timed where the bytes leave (server/generation.py sse): token sampled -> its
    # chunk written, and the gaps between one stream's writes (the ITL its client can see).
    delivery: Histogram = field(default_factory=lambda: Histogram(DELIVERY_BUCKETS))
    socket_itl: Histogram = field(default_factory=Histogram)
    # The same two as (at, seconds) samples for the dashboard's last-minute percentiles (feed.py):
    # 8 streams at 100 tok/s for a minute is 48 000 each; past that the oldest go.
    socket_window: deque = field(default_factory=lambda: deque(maxlen=100_000))
    delivery_window: deque = field(default_factory=lambda: deque(maxlen=100_000))

    @property
    def sampling_defaults(self) -> dict:
        """The model's recommended sampling for what a request leaves unset (an HF directory's
        generation_config.json, as vLLM reads it by default; {} for a GGUF file)."""
        return _sampling_defaults(str(self.model.source)) if self.model is not None else {}

    @property
    def model_card(self) -> dict | None:
        """What the served model is good for (`/version`, the ready line, the playground): a model
        with no chat template of its own is taken for a base model that continues text (issue 44:
        the default Gemma 3 270M answered a first chat with `|imagenumberwld`)."""
        if self.model is None:
            return None
        base = not self.model.tokenizer.own_template
        note = (
            f"{self.served_name} is a base model (no chat template of its own): it continues text, so "
            "use /v1/completions; for chat, serve an instruct model (e.g. --model smollm2-135m)"
            if base
            else f"{self.served_name} is an instruct model (its own chat template): chat and completions"
        )
        return {"id": self.served_name, "base": base, "note": note}

    @property
    def ready(self) -> bool:
        return self.engine is not None


@lru_cache(maxsize=8)
def _sampling_defaults(source: str) -> dict:
    from ..model.formats.hf_loader import sampling_defaults

    return sampling_defaults(source)
