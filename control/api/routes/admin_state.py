"""``GET /admin/state``: policy, queues, requests, KV accounting, throughput and latency."""

from __future__ import annotations

from fastapi import APIRouter

from control.api.deps import AdminDep, RuntimeDep, SessionDep
from control.schemas import ADMIN_ERRORS, AdminState

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


@router.get("/state", response_model=AdminState)
def get_state(runtime: RuntimeDep, session: SessionDep) -> AdminState:
    snap = runtime.llm_engine.snapshot()
    return AdminState(
        version=runtime.version,
        policy=snap.policy,
        policy_version=snap.policy_version,
        scheduler=snap.scheduler,
        memory_reserve=snap.memory_reserve,
        uptime_s=snap.uptime_s,
        queue=snap.queue,
        requests=list(snap.requests),
        kv=snap.kv,
        block_map=snap.block_map,
        throughput=snap.throughput,
        latency=snap.latency,
        totals=snap.totals,
        recent_reclaims=runtime.maintenance.last_runs(session),
    )
