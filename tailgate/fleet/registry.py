"""The fleet routers this process built (one per deployment handle), so the front, which holds the
handle in the same process, can count their choices in /metrics. No Ray import."""

from __future__ import annotations

import threading

_routers: list = []
_lock = threading.Lock()


def add(router) -> None:
    with _lock:
        _routers.append(router)


def route_totals() -> dict[str, int]:
    """`tailgate:route_total` by reason, over this process's routers."""
    with _lock:
        routers = list(_routers)
    out: dict[str, int] = {}
    for r in routers:
        for reason, n in r.route_counts().items():
            out[reason] = out.get(reason, 0) + n
    return out


def route_loads() -> dict[str, int]:
    """Requests the routers placed that have not completed, by replica (`tailgate:fleet_inflight`)."""
    with _lock:
        routers = list(_routers)
    out: dict[str, int] = {}
    for r in routers:
        for rid, n in dict(r.loads).items():
            out[rid] = out.get(rid, 0) + n
    return out
