"""A fleet's dashboard feed (`GET /dashboard/feed` on `tailgate serve --replicas N`), answered by
the front itself: every PERIOD_S it asks each running replica for one tick of its own feed
(`EngineReplica.feed`, a call pinned to that replica) and sends the page one merged `tick` with
the fleet's totals, the fleet's inter-token gap percentiles (over the connection's window), every replica's steps (each tagged
with its `replica`), and a line per replica.

Why the front and not a replica (issue 37): forwarded like any request, the feed was one long
stream that the router placed on one replica and counted as a request in flight there until the
tab closed (skewing its least-loaded choices), and it showed only that replica. Pinned calls are
neither placed nor counted by the router (`fleet/router.py`), and a dashboard now sees all.

The fleet's ITL percentiles are exact, not an average of the replicas': each tick a replica sends
the gaps that ended since the front's cursor for it, and the front keeps a minute of them per
replica, or the `?window=S` a connection asks for (replicas on other hosts keep their own clocks, so each is trimmed by its own `now`).
A connection's `since` is checked as one server checks it, but a fleet feed starts every replica
from its oldest kept step (step numbers are per replica).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

from ..server.feed import MAX_GAPS, PERIOD_S, WINDOW_S, drop_before, gap_stats

# Serve's controller is asked which replicas run every REFRESH_TICKS ticks (~2 s), not every tick:
# the question is a call to the controller actor, and a replaced replica can wait that long.
REFRESH_TICKS = 8
# Counts the fleet's tick sums over its replicas, by the single server's names (feed.tick).
SUMMED = (
    "running",
    "waiting",
    "held",
    "kv_pages_used",
    "prefix_hits",
    "prefix_queries",
    "preemptions",
    "steps_total",
    "generation_tokens",
)


class FleetWindow:
    """One dashboard connection's view of the fleet: per replica, the last step it was sent, the
    end of the last gap it was sent, and its gaps of the last `window_s` (the connection's
    `?window=S`, WINDOW_S unless asked)."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.since: dict[str, int] = {}
        self.after: dict[str, float] = {}
        self.gaps: dict[str, deque] = {}

    def ask(self, rid: str) -> tuple[int, float | None]:
        return self.since.get(rid, -1), self.after.get(rid)

    def merge(self, reports: dict[str, dict], members) -> dict:
        """The page's tick from the replicas' reports (replica id -> `feed.report` + `replica`).
        A replica no longer among `members` is forgotten; one that missed this tick keeps its
        cursors (forgotten, it would send every step it keeps again, and the page draw them twice)."""
        for gone in set(self.gaps) - set(members):
            for held in (self.since, self.after, self.gaps):
                held.pop(gone, None)
        out = {k: 0 for k in SUMMED}
        out["steps"], rows, every = [], [], []
        for rid, r in sorted(reports.items()):
            gaps = self.gaps.setdefault(rid, deque(maxlen=MAX_GAPS))
            gaps.extend((a, g) for a, g in r["gaps"])
            if r["gaps"]:  # the cursor: what the replica sent, kept or not (it keeps KEEP_S)
                self.after[rid] = r["gaps"][-1][0]
            drop_before(gaps, r["now"] - self.window_s)
            if r["steps"]:
                self.since[rid] = r["steps"][-1]["seq"]
            for k in SUMMED:
                out[k] += r[k]
            out["steps"] += [{**s, "replica": rid} for s in r["steps"]]
            values = [g for _, g in gaps]
            every += values
            rows.append(
                {
                    "id": rid,
                    "now": r["now"],
                    "running": r["running"],
                    "waiting": r["waiting"],
                    "held": r["held"],
                    "kv_usage": r["kv_usage"],
                    "steps_total": r["steps_total"],
                    "itl": gap_stats(values, self.window_s),
                    "error": r.get("error"),
                }
            )
        # Every replica's pool is the same size (one spec), so the mean of their usages is the
        # fleet's share of KV pages in use.
        out["kv_usage"] = sum(r["kv_usage"] for r in rows) / len(rows) if rows else 0.0
        out["itl"] = gap_stats(every, self.window_s)
        out["now"] = max((r["now"] for r in rows), default=0.0)
        out["replicas"] = rows
        return out


def hello(first: dict, ids: list[str]) -> dict:
    """The feed's first message: one replica's hello (every replica runs the same spec) and the
    replicas running when the page connected."""
    return {**first["hello"], "replicas": sorted(ids)}


async def events(ask, members, window: FleetWindow, period: float = PERIOD_S):
    """The SSE text of one connection. `ask(rid, since, after, hello)` is an awaitable giving
    that replica's report, or None when it did not answer; `members()` an awaitable giving the
    running replicas' ids. Ends (after an `error` event) when no replica answers."""
    sse = lambda kind, obj: f"event: {kind}\ndata: {json.dumps(obj)}\n\n"  # noqa: E731
    ids, n, said_hello, missed = await members(), 0, False, False
    while True:
        if missed or (n and n % REFRESH_TICKS == 0):  # a replica that did not answer may have left
            ids = await members()
        got = await asyncio.gather(*(ask(rid, *window.ask(rid), not said_hello) for rid in ids))
        missed = any(r is None for r in got)
        # Filed under the id the replica gives: under `--router pow2` (Serve's own router) a
        # pinned call is not honoured and may reach another replica than the one asked.
        reports = {r["replica"]: r for r in got if r is not None}
        if not reports:
            yield sse("error", {"message": "no replica of the fleet answered the dashboard feed"})
            return
        if not said_hello:
            first = next(r for r in reports.values() if "hello" in r)
            yield sse("hello", hello(first, list(reports)))
            said_hello = True
        # Off the event loop: the percentiles sort the window's gaps of every replica, and the
        # front's loop carries every client's stream.
        yield sse("tick", await asyncio.to_thread(window.merge, reports, ids))
        n += 1
        await asyncio.sleep(period)
