"""``GET /health`` (liveness) and ``GET /ready`` (readiness).

``/health``: 200 while the process serves and its engine loop thread is alive; 503 while the
model loads or after the engine failed. ``/ready``: 200 when new traffic is welcome; 503 with
the reason while loading, failed, draining (shutting down) or stalled, so an orchestrator
stops routing to the server without killing it.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control.api.deps import ContextDep
from control.schemas.health import Health, HealthLoading, NotReady, Ready

router = APIRouter(tags=["public"])


@router.get("/health", response_model=Health, responses={503: {"model": HealthLoading}})
def health(ctx: ContextDep) -> Health | JSONResponse:
    runtime = ctx.runtime
    if runtime is None or not runtime.service.is_running:
        status = "loading" if runtime is None and ctx.load_error is None else "failed"
        return JSONResponse(HealthLoading(status=status).model_dump(), status_code=503)
    return Health(
        model=runtime.model_name,
        policy=runtime.in_force.settings.policy.name,
        version=runtime.in_force.version,
        reclaim_job_on_time=runtime.maintenance.on_time(),
    )


@router.get("/ready", response_model=Ready, responses={503: {"model": NotReady}})
def ready(ctx: ContextDep) -> Ready | JSONResponse:
    not_ready = ctx.not_ready()
    if not_ready is not None:
        headers = {"Retry-After": "1"} if not_ready.reason != "failed" else None
        return JSONResponse(not_ready.model_dump(), status_code=503, headers=headers)
    return Ready()
