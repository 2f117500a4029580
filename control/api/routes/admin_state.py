"""``GET /admin/state``: policy, queues, requests, KV accounting, throughput and latency;
``GET /admin/kv/integrity``: the block manager's self-check."""

from __future__ import annotations

from fastapi import APIRouter

from control.api.deps import AdminDep, RuntimeDep, ServiceDep, SessionDep
from control.fleet.schemas import AdminState, ReplicaTotals
from control.schemas.errors import ADMIN_ERRORS
from engine.kv_stats import KVIntegrity

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


@router.get("/state", response_model=AdminState)
def get_state(runtime: RuntimeDep, session: SessionDep) -> AdminState:
    snap = runtime.service.snapshot()
    fleet = runtime.service.replicas()
    replicas = fleet.views() if fleet is not None else []
    # The snapshot's fields by name (its own reclaim log is replaced by the recorded sweeps).
    return AdminState(
        **{name: getattr(snap, name) for name in AdminState.model_fields if hasattr(snap, name)},
        version=runtime.in_force.version,
        recent_reclaims=runtime.maintenance.last_runs(session),
        replicas=replicas,
        replica_totals=ReplicaTotals.of(replicas) if fleet is not None else None,
        restart=fleet.restart_view() if fleet is not None else None,
        text_exposed=runtime.text is not None,
    )


@router.get("/kv/integrity", response_model=KVIntegrity)
def get_kv_integrity(service: ServiceDep, runtime: RuntimeDep) -> KVIntegrity:
    """Check the KV bookkeeping at a step boundary: every block in exactly one state, ref
    counts equal to the block tables, the stored-token count consistent."""
    return service.check_kv_integrity(runtime.in_force.apply_timeout_s)
