"""``/admin/state`` with a fleet: each replica's version, queues, KV and routing inputs, and
the totals (plain pydantic, no Ray: the route imports it in every server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from control.schemas import state
from engine.kv_stats import KVStats, ReclaimResult
from serving.snapshot import EngineSnapshot


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica says of itself: ``/admin/state``'s entry and the routing inputs."""

    replica: str
    pid: int
    version: int | None
    started_at: float
    snapshot: EngineSnapshot
    last_reclaim: ReclaimResult | None


class ReplicaView(BaseModel):
    replica: str = Field(description="Ray Serve's replica id.")
    up: bool = Field(description="It answered this state request.")
    error: str | None = Field(None, description="Why it did not answer.")
    pid: int | None = None
    version: int | None = Field(None, description="The policy version it runs.")
    policy: str | None = None
    started_at: float | None = Field(None, description="Unix time its engine started.")
    waiting: int = 0
    running: int = 0
    in_flight: int = Field(0, description="Requests this control plane routed there, not ended.")
    free_blocks: int = Field(0, description="Free or cached KV blocks above the reserve.")
    kv: KVStats | None = None
    generation_tokens: int = 0
    last_reclaim: ReclaimResult | None = Field(
        None, description="The replica's last reclaim sweep (each sweeps its own pool)."
    )

    @classmethod
    def of(cls, replica: str, report: ReplicaReport | Exception, in_flight: int) -> ReplicaView:
        """A replica's ``report()``, or the error its call ended with (it is then down)."""
        if isinstance(report, Exception):
            return cls(replica=replica, up=False, error=str(report))
        snap, kv, reclaim = report.snapshot, report.snapshot.kv, report.last_reclaim
        return cls(
            replica=replica,
            up=True,
            pid=report.pid,
            version=report.version,
            policy=snap.policy.name,
            started_at=report.started_at,
            waiting=snap.scheduler.waiting,
            running=snap.scheduler.running,
            in_flight=in_flight,
            free_blocks=max(0, kv.free + kv.cached - kv.reserved),
            kv=kv,
            generation_tokens=snap.totals.generation_tokens,
            last_reclaim=reclaim,
        )


class ReplicaTotals(BaseModel):
    replicas: int
    up: int
    waiting: int
    running: int
    free_blocks: int
    kv_total: int
    kv_used: int
    kv_cached: int
    generation_tokens: int
    versions: list[int] = Field(description="The distinct policy versions the replicas run.")

    @classmethod
    def of(cls, views: list[ReplicaView]) -> ReplicaTotals:
        up = [v for v in views if v.up]
        return cls(
            replicas=len(views),
            up=len(up),
            waiting=sum(v.waiting for v in up),
            running=sum(v.running for v in up),
            free_blocks=sum(v.free_blocks for v in up),
            kv_total=sum(v.kv.total for v in up if v.kv),
            kv_used=sum(v.kv.used for v in up if v.kv),
            kv_cached=sum(v.kv.cached for v in up if v.kv),
            generation_tokens=sum(v.generation_tokens for v in up),
            versions=sorted({v.version for v in up if v.version is not None}),
        )


RestartState = Literal["running", "done", "failed"]


class RestartView(BaseModel):
    """A rolling restart (``POST /admin/fleet/restart``): one replica at a time leaves
    routing, drains, and is replaced; the next goes once the new one is up."""

    id: int = Field(description="This server's count of restarts.")
    state: RestartState
    replicas: list[str] = Field(description="The replicas it restarts (those up when it began).")
    version: int = Field(description="The policy version the new replicas start on.")
    drain_timeout_s: float = Field(
        description="How long a stopping replica's requests may run before they end in error."
    )
    started_at: float = Field(description="Unix time.")
    finished_at: float | None = None
    left: list[str] = Field(
        default_factory=list, description="Replicas of ``replicas`` out of routing, in order."
    )
    started: list[str] = Field(default_factory=list, description="New replicas up, in order.")
    draining: str | None = Field(
        None, description="The replica finishing its requests now (Ray reports one stopping)."
    )
    replica_states: dict[str, int] = Field(
        default_factory=dict,
        description="Ray Serve's count of replicas by state while it runs (RUNNING, STOPPING, "
        "STARTING...).",
    )
    error: str | None = None


class AdminState(state.AdminState):
    """``/admin/state``. With ``--replicas``, the top-level engine figures are the control
    plane's own engine (idle: it tokenizes and checks admission); the fleet is in
    ``replicas`` and ``replica_totals``."""

    replicas: list[ReplicaView] = Field(
        default_factory=list, description="Each engine replica (with --replicas; else empty)."
    )
    replica_totals: ReplicaTotals | None = None
    restart: RestartView | None = Field(
        None, description="The rolling restart running, or the last one (with --replicas)."
    )
