"""``GET /health``: 200 while serving; 503 while the model loads, or when the engine failed."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control.api.deps import ContextDep
from control.schemas import Health, HealthLoading

router = APIRouter(tags=["public"])


@router.get("/health", response_model=Health, responses={503: {"model": HealthLoading}})
def health(ctx: ContextDep):
    runtime = ctx.runtime
    if runtime is None or not runtime.engine.is_running:
        status = "loading" if runtime is None and ctx.load_error is None else "failed"
        return JSONResponse(HealthLoading(status=status).model_dump(), status_code=503)
    return Health(
        model=runtime.model_name,
        policy=runtime.llm_engine.policy_spec.name,
        version=runtime.version,
        reclaim_job_on_time=runtime.maintenance.on_time(),
    )
