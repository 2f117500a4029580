"""Test-only routes, mounted only when the server starts with ``SERVEDECK_TESTING=1``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from control.api.deps import AdminDep, RuntimeDep
from control.models import utcnow
from control.schemas import ADMIN_ERRORS, LeakResult, StallResult

router = APIRouter(
    prefix="/admin/testing", tags=["testing"], dependencies=[AdminDep], responses=ADMIN_ERRORS
)


@router.post("/leak/{request_id}", response_model=LeakResult)
def leak(request_id: str, runtime: RuntimeDep) -> LeakResult:
    """Drop a request without freeing its KV blocks: what the reclaim sweep must repair."""
    rows = runtime.llm_engine.snapshot().requests
    blocks = next((row.blocks for row in rows if row.id == request_id), 0)
    leaked = runtime.engine.leak(request_id)
    return LeakResult(request_id=request_id, leaked=leaked, blocks=blocks, at=utcnow())


@router.post("/stall", response_model=StallResult)
def stall_engine(
    runtime: RuntimeDep, seconds: Annotated[float, Query(gt=0, le=600)]
) -> StallResult:
    """Block the engine loop for ``seconds`` in its next step with requests in flight (what
    the stall watchdog must notice); answers at once."""
    runtime.engine.stall(seconds)
    return StallResult(seconds=seconds, at=utcnow())
