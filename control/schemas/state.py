"""``GET /admin/state``, ``GET /admin/jobs`` and the recorded sweeps."""

from __future__ import annotations

from datetime import datetime

from pydantic import (
    BaseModel,
    Field,
    SerializeAsAny,
)

from control.models import ReclaimRunBase
from engine.kv_stats import KVStats
from engine.timeline import WaitSummary
from policies.queue import FcfsQueue, QueueSpec
from policies.snapshot import PolicySnapshot
from policies.spec import PolicySpec
from serving.snapshot import (
    ComputeState,
    Latency,
    QueueDepths,
    RequestSnapshot,
    TenantSnapshot,
    Throughput,
    Totals,
)


class ReclaimRun(ReclaimRunBase):
    """A recorded reclaim sweep: when, why, how it ended and what it did."""


class JobView(BaseModel):
    id: str
    interval_s: float
    next_run_at: datetime | None
    on_time: bool
    last_runs: list[ReclaimRun]


class JobsView(BaseModel):
    jobs: list[JobView]


SchedulerState = PolicySnapshot
"""The policy's own snapshot (policies/base.py; each policy's subclass adds its fields)."""


RequestRow = RequestSnapshot


KVState = KVStats
"""The KV accounting, defined once by the engine (engine/kv_stats.py). Queue depths,
throughput, latency and totals are the engine snapshot's own models too."""


class AdminState(BaseModel):
    """``/admin/state``: the engine's snapshot (serving/snapshot.py), read by attribute, with
    the control plane's version and its recorded reclaim sweeps."""

    version: int
    policy: PolicySpec
    policy_version: int | None = Field(
        None, description="The policy version the engine reports it runs (set with the policy)."
    )
    scheduler: SerializeAsAny[SchedulerState]
    memory_reserve: float
    uptime_s: float
    queue: QueueDepths
    queue_order: QueueSpec = Field(
        default_factory=FcfsQueue, description="The queue discipline in force."
    )
    tenants: list[TenantSnapshot] = Field(
        default_factory=list,
        description="Every tenant seen (bounded; the rest as 'other'): weight, counter, "
        "service, waiting, running, refused.",
    )
    requests: list[RequestRow]
    kv: KVState
    block_map: str = Field(description="One character per block: '.' free, '#' used, 'c' cached.")
    throughput: Throughput
    latency: Latency
    totals: Totals
    recent_reclaims: list[ReclaimRun]
    text_exposed: bool = Field(
        description="Whether the server keeps requests' prompt and output text "
        "(--expose-text; GET /admin/requests/{id})."
    )
    compute: ComputeState | None = Field(
        None,
        description="The dtype and the decode attention in force, each with why (--dtype "
        "auto's choice for this CPU; the native kernel or torch's products).",
    )
    waits: WaitSummary | None = Field(
        None,
        description="Where the waiting went, by what held the queue's head (the reasons of "
        "docs/observability.md): over the last window and since the start; and what holds the "
        "head now. Each waiting request's own reason is in requests[].wait.",
    )
