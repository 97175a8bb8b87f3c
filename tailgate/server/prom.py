"""Prometheus text rendering: vLLM-compatible families plus tailgate's own."""
from __future__ import annotations

from ..engine.metrics import Histogram


def _labels(model: str, extra: dict | None = None) -> str:
    items = {"model_name": model, **(extra or {})}
    return "{" + ",".join(f'{k}="{v}"' for k, v in items.items()) + "}"


class Exposition:
    def __init__(self, model: str):
        self.model = model
        self.lines: list[str] = []

    def gauge(self, name: str, value: float, help_: str) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{_labels(self.model)} {value}"]

    def counter(self, name: str, value, help_: str, label: str | None = None) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
        if label is None:
            self.lines.append(f"{name}{_labels(self.model)} {value}")
        else:
            for k, v in value.items():
                self.lines.append(f"{name}{_labels(self.model, {label: k})} {v}")

    def histogram(self, name: str, h: Histogram | dict, help_: str, label: str | None = None) -> None:
        """One histogram, or (with `label`) one series per key of a dict of histograms."""
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for key, hist in (h.items() if label else [(None, h)]):
            extra = {label: key} if label else {}
            cum = 0
            for le, c in zip(list(hist.buckets) + ["+Inf"], hist.counts):
                cum += c
                self.lines.append(f"{name}_bucket{_labels(self.model, {**extra, 'le': le})} {cum}")
            self.lines.append(f"{name}_sum{_labels(self.model, extra)} {hist.total}")
            self.lines.append(f"{name}_count{_labels(self.model, extra)} {hist.n}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
