"""/metrics: vLLM-compatible Prometheus families plus tailgate's own, through prometheus_client.

Engine figures come from the snapshot the engine thread publishes after each step
(`Engine.snapshot`), server-side latencies from the histograms the event loop keeps; a
collector turns both into metric families at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..engine.metrics import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Families:
    def __init__(self, model: str):
        self.model, self.out = model, []

    def gauge(self, name, value, doc, label: str | None = None):
        g = GaugeMetricFamily(name, doc, labels=["model_name"] + ([label] if label else []))
        for key, v in value.items() if label else [(None, value)]:
            g.add_metric([self.model] + ([str(key)] if label else []), v)
        self.out.append(g)

    def counter(self, name, value, doc, label: str | None = None):
        # prometheus_client appends `_total` to a counter family's name.
        c = CounterMetricFamily(name.removesuffix("_total"), doc, labels=["model_name"] + ([label] if label else []))
        for key, v in value.items() if label else [(None, value)]:
            c.add_metric([self.model] + ([str(key)] if label else []), v)
        self.out.append(c)

    def histogram(self, name, h: Histogram | dict, doc, label: str | None = None):
        f = HistogramMetricFamily(name, doc, labels=["model_name"] + ([label] if label else []))
        for key, hist in h.items() if label else [(None, h)]:
            cum, buckets = 0, []
            for le, c in zip([str(float(b)) for b in hist.buckets] + ["+Inf"], hist.counts):
                cum += c
                buckets.append((le, cum))
            f.add_metric([self.model] + ([str(key)] if label else []), buckets, hist.total)
        self.out.append(f)


class TailgateCollector:
    def __init__(self, state):
        self.state = state

    def collect(self):
        st = self.state
        x = _Families(st.served_name)
        if st.ready:
            snap = st.engine.snapshot
            m = snap.metrics
            x.gauge("vllm:num_requests_running", snap.running, "Requests in the decode roster or mid-prefill.")
            x.gauge("vllm:num_requests_waiting", snap.waiting, "Requests waiting to be admitted.")
            x.gauge("vllm:kv_cache_usage_perc", snap.kv_usage, "Fraction of KV pages in use (both pools).")
            x.gauge("tailgate:kv_pages_used", snap.kv_pages_used, "KV pages in use, both pools.")
            x.gauge(
                "tailgate:kv_pages_idle",
                snap.kv_pages_idle,
                "Unheld KV pages the prefix cache keeps, both pools (evicted only when an allocation needs them).",
            )
            x.counter(
                "tailgate:recompute_prefix_hits",
                snap.recompute_hits,
                "Tokens a recompute after preemption found in the prefix cache (its own prompt and output pages).",
            )
            x.counter("vllm:prompt_tokens_total", m.prompt_tokens, "Prefilled prompt tokens.")
            x.counter("vllm:generation_tokens_total", m.generation_tokens, "Generated tokens.")
            x.counter(
                "vllm:request_success_total",
                {k: v for k, v in m.finished.items() if k in ("stop", "length")},
                "Finished requests by reason.",
                label="finished_reason",
            )
            x.counter("vllm:num_preemptions_total", m.preemptions, "Live rows preempted for KV pages (KV_CACHE_MB).")
            x.counter(
                "vllm:prefix_cache_queries_total",
                m.prefix_queries,
                "Prompt tokens looked up in the prefix cache (PREFIX_CACHE).",
            )
            x.counter("vllm:prefix_cache_hits_total", m.prefix_hits, "Prompt tokens served from the prefix cache.")
            x.counter(
                "tailgate:lane_prefills_total",
                m.lane_prefills,
                "Prompts prefilled on the side lane (ASYNC_PREFILL=cpu:N).",
            )
            x.gauge("tailgate:door_held_requests", snap.held, "Arrivals the coalesce door holds now.")
            x.histogram("tailgate:door_hold_seconds", m.door_hold, "How long the door held each released arrival.")
            x.counter("tailgate:door_releases_total", dict(m.door_releases), "Door openings by reason.", label="reason")
            x.histogram("tailgate:step_prefill_rows", m.prefill_rows, "Prompt rows per step that carried prompts.")
            x.histogram("tailgate:step_decode_rows", m.decode_rows, "Decode rows per step that carried any.")
            x.histogram(
                "tailgate:inter_token_latency_by_cause_seconds",
                dict(m.itl_by_cause),
                "Engine-side gaps between a stream's tokens, by the kind of step that ended the gap "
                "(decode, mixed, walk, prefill, recompute, lane).",
                label="cause",
            )
            x.histogram(
                "tailgate:step_prompt_rows",
                m.step_prompt_rows,
                "Prompt rows each walk round took under ITL_TARGET_MS (what the target chose).",
            )
            x.counter(
                "tailgate:walk_rounds_widened_total",
                m.rounds_widened,
                "Walk rounds TTFT_TARGET_MS widened past the inter-token price to clear the waiting prompts.",
            )
            x.counter(
                "tailgate:walk_rounds_kept_up_total",
                m.rounds_kept_up,
                "Priced walk rounds held wider than their price: the rows that keep every request in the system decoding.",
            )
            x.histogram(
                "tailgate:step_cost_error_ratio",
                m.step_cost_error,
                "|predicted - measured| / measured step time, per step the fitted cost model priced (ITL_TARGET_MS).",
            )
            if m.step_cost:  # the last step and the fit; the target only under ITL_TARGET_MS
                sc = m.step_cost
                if "target_s" in sc:  # since f4c2e5d the fit is kept without a target too
                    x.gauge("tailgate:itl_target_seconds", sc["target_s"], "The step time walk rounds are priced to.")
                if "actual_s" in sc:
                    x.gauge("tailgate:step_seconds", sc["actual_s"], "The last step's measured time.")
                if "predicted_s" in sc:
                    x.gauge(
                        "tailgate:step_predicted_seconds",
                        sc["predicted_s"],
                        "The last priced step's predicted time (before it ran).",
                    )
                if "pace" in sc:
                    x.gauge(
                        "tailgate:step_cost_pace",
                        sc["pace"],
                        "The host's pace: recent measured / fitted step times (predictions are the fit times this).",
                    )
                terms = {k: v for k, v in sc.items() if k not in ("target_s", "actual_s", "predicted_s", "pace")}
                if terms:
                    x.gauge(
                        "tailgate:step_cost_coefficient",
                        terms,
                        "The fitted step-cost model: seconds per step (floor), per prompt / decode / sampled "
                        "row, per 1000 query-key pairs (attn_per_1k).",
                        label="term",
                    )
        x.histogram("vllm:time_to_first_token_seconds", st.ttft, "Time to first token.")
        x.histogram("vllm:inter_token_latency_seconds", st.itl, "Gaps between tokens.")
        x.histogram(
            "tailgate:delivery_delay_seconds",
            st.delivery,
            "Streams: a token sampled -> its chunk written to the socket (the part of a client's gap the "
            "engine's own figures do not see).",
        )
        x.histogram(
            "tailgate:socket_inter_token_seconds",
            st.socket_itl,
            "Streams: gaps between one stream's chunk writes, timed at the socket (the ITL its client sees, "
            "less the network).",
        )
        if st.ready:
            x.counter(
                "tailgate:delivery_wait_timeouts_total",
                st.engine.fence_timeouts,
                "Steps launched before the streams had written the last step's tokens (--delivery-wait-ms ran out).",
            )
        x.histogram("vllm:e2e_request_latency_seconds", st.e2e, "Arrival to finish.")
        x.histogram("vllm:request_queue_time_seconds", st.queue_time, "Arrival to admission.")
        return x.out


def registry_for(state) -> CollectorRegistry:
    """A registry of its own per app (not the process-global one), so tests can run several."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TailgateCollector(state))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
