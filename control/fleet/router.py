"""``FleetRouter``: the Ray Serve request router of the engine replicas (imports ray).

A call with a ``replica`` keyword goes to that replica alone (the control plane's fan-out).
A ``generate`` call is ranked by ``score.rank`` over the replicas' routing stats, the requests
in flight from here, and the prefix-cache hits the client probed (its ``route`` keyword).
The router lives in the process holding the deployment handle (the control plane); it
registers itself (``registry.py``) so the fleet client can list the live replicas and their stats.
"""

from __future__ import annotations

from collections import defaultdict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from control.fleet import registry
from control.fleet.score import ReplicaLoad, RouteHint, rank

TARGET = "replica"
"""The keyword that sends a call to one replica."""


class FleetRouter(RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        self._in_flight: dict[str, set[str]] = defaultdict(set)

    # -- what the client reads -----------------------------------------------------------

    def replica_ids(self) -> list[str]:
        return sorted(r.unique_id for r in self.curr_replicas)

    def loads(self) -> dict[str, ReplicaLoad | None]:
        return {
            rid.unique_id: ReplicaLoad.of(replica.routing_stats)
            for rid, replica in self.curr_replicas.items()
        }

    def in_flight(self) -> dict[str, int]:
        return {rid: len(ids) for rid, ids in self._in_flight.items()}

    # -- Ray Serve's hooks ---------------------------------------------------------------

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        registry.ROUTERS[self._deployment_id.name] = self
        live = {r.replica_id.unique_id for r in replicas}
        for gone in set(self._in_flight) - live:
            del self._in_flight[gone]

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else {}
        if (target := kwargs.get(TARGET)) is not None:
            return [[by_id[target]]] if target in by_id else []
        hint = kwargs.get("route")
        loads = {rid: ReplicaLoad.of(r.routing_stats) for rid, r in by_id.items()}
        ranks = rank(
            list(by_id), loads, self.in_flight(), hint if isinstance(hint, RouteHint) else None
        )
        return [[by_id[rid] for rid in ids] for ids in ranks]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result
    ) -> None:
        if pending_request.metadata.call_method == "generate":
            self._in_flight[replica_id.unique_id].add(pending_request.metadata.internal_request_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._in_flight.get(replica_id.unique_id, set()).discard(internal_request_id)
