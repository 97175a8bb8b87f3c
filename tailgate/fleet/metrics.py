"""The fleet's /metrics: every replica's families (the single-process server's, `server/metrics.py`)
merged into one family each, every sample labelled with its `replica`, plus the front's own: the
router's choices (`tailgate:route_total{reason}`), the retries of requests whose replica was lost
before they started, the in-flight streams that ended with an error event, and the fleet's size."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families


def merge(replica_texts: dict[str, str]) -> list[Metric]:
    """One family per name over all replicas, each sample with a `replica` label."""
    fams: dict[str, Metric] = {}
    for rid, text in sorted(replica_texts.items()):
        for fam in text_string_to_metric_families(text):
            out = fams.get(fam.name)
            if out is None:
                out = fams[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                out.add_sample(s.name, {**s.labels, "replica": rid}, s.value, s.timestamp, s.exemplar)
    return list(fams.values())


class _Collector:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def render(
    replica_texts: dict[str, str],
    routes: dict[str, int],
    front: dict[str, int],
    replicas: dict[str, int],
    loads: dict[str, int] | None = None,
) -> bytes:
    """The text a fleet's /metrics answers: `front` holds `retries` and `stream_errors`,
    `replicas` the fleet's `running` and `target` counts, `loads` the router's requests in flight
    by replica."""
    own: list[Metric] = []
    c = CounterMetricFamily(
        "tailgate:route",
        "Requests the fleet's router placed, by why it chose the replica (prefix, imbalance, least-loaded, least-cached, random).",
        labels=["reason"],
    )
    for reason, n in sorted(routes.items()):
        c.add_metric([reason], n)
    own.append(c)
    own.append(
        CounterMetricFamily(
            "tailgate:fleet_retries",
            "Requests sent again to another replica because theirs was lost before they started.",
            value=front.get("retries", 0),
        )
    )
    own.append(
        CounterMetricFamily(
            "tailgate:fleet_stream_errors",
            "In-flight responses cut by a lost replica (streams end with an error event).",
            value=front.get("stream_errors", 0),
        )
    )
    g = GaugeMetricFamily("tailgate:fleet_replicas", "Engine replicas: running now, and the target.", labels=["state"])
    for state, n in sorted(replicas.items()):
        g.add_metric([state], n)
    own.append(g)
    inflight = GaugeMetricFamily(
        "tailgate:fleet_inflight",
        "Requests the router placed on a replica that have not completed: the load it routes by.",
        labels=["replica"],
    )
    for rid, n in sorted((loads or {}).items()):
        inflight.add_metric([rid], n)
    own.append(inflight)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(own + merge(replica_texts)))
    return generate_latest(reg)
