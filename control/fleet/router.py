"""``FleetRouter``: the Ray Serve request router of the engine replicas (imports ray).

A call with a ``replica`` keyword goes to that replica alone (the control plane's fan-out).
A ``generate`` call is ranked by ``score.rank`` over the replicas' routing stats, the requests
in flight from here, and the prefix-cache hits the client probed (its ``route`` keyword),
with ``affinity.PrefixAffinity`` standing in for a replica that did not answer the probe.
The router lives in the process holding the deployment handle (the control plane); it
registers itself (``registry.py``) so the fleet client can list the live replicas and their stats.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from control.fleet import registry
from control.fleet.affinity import PrefixAffinity, merged
from control.fleet.inflight import InFlight
from control.fleet.score import ReplicaLoad, RouteHint, rank

TARGET = "replica"
"""The keyword that sends a call to one replica."""


class ReplicaGone(RuntimeError):
    """A call for one replica that is no longer among the live ones."""


class FleetRouter(RequestRouter):
    def initialize_state(self, **kwargs: object) -> None:
        self._in_flight = InFlight()
        """``generate`` requests chosen for or sent to each replica, by Ray's request id."""
        self._affinity = PrefixAffinity()
        """Where each prompt prefix was sent: the hits of a replica whose probe was late."""

    # -- what the client reads -----------------------------------------------------------
    # From the control plane's threads, while Ray's router loop (another thread) changes
    # these records: each is copied before it is walked.

    def replica_ids(self) -> list[str]:
        return sorted(r.unique_id for r in list(self.curr_replicas))

    def loads(self) -> dict[str, ReplicaLoad | None]:
        return {
            rid.unique_id: ReplicaLoad.of(replica.routing_stats)
            for rid, replica in list(self.curr_replicas.items())
        }

    def in_flight(self) -> dict[str, int]:
        return self._in_flight.counts()

    # -- Ray Serve's hooks ---------------------------------------------------------------

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        if replicas:  # the deployment's name from a replica's public id (Ray's own is private)
            registry.ROUTERS[replicas[0].replica_id.deployment_id.name] = self
        live = {r.replica_id.unique_id for r in replicas}
        self._in_flight.keep_only(live)
        self._affinity.keep_only(live)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs = pending_request.kwargs if pending_request is not None else {}
        if (target := kwargs.get(TARGET)) is not None:
            if target in by_id:
                return [[by_id[target]]]
            # The replica left (died, drained) after the call was made. An empty answer
            # would have Ray ask again at once, with no await between: this event loop, and
            # every request routed through it, would spin here for good. The call fails
            # instead, and any candidate lets Ray's loop see its future done and move on.
            if pending_request is not None and not pending_request.future.done():
                pending_request.future.set_exception(ReplicaGone(f"replica {target} is gone"))
            return [candidate_replicas]
        hint = kwargs.get("route")
        if isinstance(hint, RouteHint):  # a replica that did not answer the probe: memory
            remembered = self._affinity.hits(hint.blocks)
            hint = RouteHint(hint.prompt_blocks, merged(hint.hits, remembered), hint.blocks)
        else:
            hint = None
        metadata = pending_request.metadata if pending_request is not None else None
        generating = None  # a generate call's request id: the calls counted in flight
        if metadata is not None and metadata.call_method == "generate":
            generating = metadata.internal_request_id
        tries = self._in_flight.retry(generating) if generating is not None else 0
        loads = {rid: ReplicaLoad.of(r.routing_stats) for rid, r in by_id.items()}
        ranks = rank(
            list(by_id),
            loads,
            self.in_flight(),  # this request's own earlier choice no longer counted
            hint,
            attempt=tries,
        )
        if generating is not None and ranks:
            # Counted at once: the other routing tasks of a burst see it before it is sent.
            self._in_flight.chosen(generating, ranks[0][0], tries + 1)
        return [[by_id[rid] for rid in ids] for ids in ranks]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: object
    ) -> None:
        if pending_request.metadata.call_method == "generate":
            request = pending_request.metadata.internal_request_id
            self._in_flight.routed(request, replica_id.unique_id)
            hint = pending_request.kwargs.get("route")
            if isinstance(hint, RouteHint) and hint.blocks:
                self._affinity.record(hint.blocks, replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._in_flight.completed(internal_request_id, replica_id.unique_id)
