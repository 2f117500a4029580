"""Test-only routes, mounted only when the server starts with ``SERVEDECK_TESTING=1``."""

from __future__ import annotations

from fastapi import APIRouter

from control.api.deps import AdminDep, RuntimeDep
from control.models import utcnow
from control.schemas import LeakResult

router = APIRouter(prefix="/admin/testing", tags=["testing"], dependencies=[AdminDep])


@router.post("/leak/{request_id}", response_model=LeakResult)
def leak(request_id: str, runtime: RuntimeDep) -> LeakResult:
    """Drop a request without freeing its KV blocks: what the reclaim sweep must repair."""
    rows = runtime.llm_engine.snapshot()["requests"]
    blocks = next((row["blocks"] for row in rows if row["id"] == request_id), 0)
    leaked = runtime.engine.leak(request_id)
    return LeakResult(request_id=request_id, leaked=leaked, blocks=blocks, at=utcnow())
