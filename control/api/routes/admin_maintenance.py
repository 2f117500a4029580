"""``POST /admin/reclaim`` (run the sweep now) and ``GET /admin/jobs``."""

from __future__ import annotations

from fastapi import APIRouter

from control.api.deps import AdminDep, RuntimeDep, SessionDep
from control.schemas.errors import ADMIN_ERRORS
from control.schemas.state import JobsView, ReclaimRun

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


@router.post("/reclaim", response_model=ReclaimRun)
def reclaim_now(runtime: RuntimeDep) -> ReclaimRun:
    return runtime.maintenance.run("manual")


@router.get("/jobs", response_model=JobsView)
def list_jobs(runtime: RuntimeDep, session: SessionDep) -> JobsView:
    return JobsView(jobs=runtime.maintenance.jobs(session))
