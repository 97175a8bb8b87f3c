"""The fleet's Ray Serve request router: `fleet/policy.RouterPolicy` (the simulator's policy too)
as a `RequestRouter` subclass, the API Serve gives for custom routing (Ray 2.60,
`ray.serve.request_router`). Ray Serve LLM's `PrefixCacheAffinityRouter` is the same idea, but
it lives in the vLLM-bound `ray.serve.llm` package and reads vLLM's request shapes.

A replica's load is the number of requests this router sent it that have not completed (running
+ waiting there): counted here on every choice and released by Serve's `on_request_completed`,
so it is exact for one front and never stale, where the replicas' own routing stats arrive once
per period. Internal calls that must reach one given replica (the front's /metrics and /health
fan-out) name it with the `pin` keyword and bypass the policy; they are not counted as routes.

Imports Ray: only `tailgate serve --replicas N > 1` loads this module.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .policy import RouterPolicy


class TailgateRouter(RequestRouter):
    """No FIFOMixin: with it Serve may hand the replica chosen for one request to an older pending
    one, which would send a prompt away from its cache; the base class fulfils the request chosen for."""

    def initialize_state(self, policy: str = "prefix", imbalance: int | None = None, **_):
        kw = {} if imbalance is None else {"imbalance": imbalance}
        self.policy = RouterPolicy(policy, **kw)
        self.inflight: dict[str, str] = {}  # internal request id -> replica unique id
        self.loads: dict[str, int] = {}
        # Serve pickles this class by value; the registry is imported here so it is the process's
        # own module (the front reads it), not a copy carried in the pickle.
        from tailgate.fleet import registry

        registry.add(self)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pin = kwargs.get("pin")
        if pin is not None:  # an internal call for one replica: it, or none (the caller times out)
            return [[by_id[pin]]] if pin in by_id else []
        key = kwargs.get("route_key") or ""
        loads = {rid: self.loads.get(rid, 0) for rid in by_id}
        rid, _ = self.policy.choose(key, loads)
        if pending_request is not None:
            rq = pending_request.metadata.internal_request_id
            old = self.inflight.pop(rq, None)  # chosen again (a rejection, a retry): the old pick is void
            if old is not None:
                self.loads[old] = max(0, self.loads.get(old, 0) - 1)
            self.inflight[rq] = rid
            self.loads[rid] = self.loads.get(rid, 0) + 1
        return [[by_id[rid]]]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        rid = self.inflight.pop(internal_request_id, None)
        if rid is not None:
            self.loads[rid] = max(0, self.loads.get(rid, 0) - 1)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        self.policy.forget(replica_id.unique_id)
        self.loads.pop(replica_id.unique_id, None)

    def route_counts(self) -> dict[str, int]:
        return dict(self.policy.reasons)
