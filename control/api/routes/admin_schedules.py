"""``/admin/schedules``: policy windows (cron start, wall-time end), audited like policy
changes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from control.api.allow import answer_other_methods
from control.api.deps import ActorDep, AdminDep, RuntimeDep, SessionDep
from control.api.errors import validation_error
from control.models import SQLITE_INTEGER_MAX
from control.schedule_store import ScheduleNotFound
from control.schemas import (
    ADMIN_ERRORS,
    BAD_BODY,
    AdminError,
    ScheduleCreate,
    ScheduleDetail,
    ScheduleList,
    ScheduleView,
)
from control.store import SettingsInvalid

NO_SCHEDULE = {404: {"model": AdminError, "description": "No such schedule."}}
ScheduleId = Annotated[int, Path(ge=1, le=SQLITE_INTEGER_MAX)]

admin = APIRouter(
    prefix="/admin/schedules", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS
)


@admin.post("", response_model=ScheduleView, status_code=201, responses=BAD_BODY)
def create_schedule(
    body: ScheduleCreate, runtime: RuntimeDep, session: SessionDep, actor: ActorDep
) -> ScheduleView:
    try:
        return runtime.schedules.create(session, body, actor)
    except SettingsInvalid as exc:
        raise validation_error(exc, "body") from None


@admin.get("", response_model=ScheduleList)
def list_schedules(runtime: RuntimeDep, session: SessionDep) -> ScheduleList:
    return runtime.schedules.list(session)


@admin.get("/{schedule_id}", response_model=ScheduleDetail, responses=NO_SCHEDULE)
def get_schedule(
    schedule_id: ScheduleId, runtime: RuntimeDep, session: SessionDep
) -> ScheduleDetail:
    try:
        return runtime.schedules.get(session, schedule_id)
    except ScheduleNotFound as exc:
        raise HTTPException(404, str(exc)) from None


@admin.delete("/{schedule_id}", response_model=ScheduleView, responses=NO_SCHEDULE)
def delete_schedule(
    schedule_id: ScheduleId,
    runtime: RuntimeDep,
    session: SessionDep,
    actor: ActorDep,
    reason: Annotated[str, Query(min_length=1, max_length=500)] = "schedule deleted",
) -> ScheduleView:
    """Its window, if in force, ends at the next tick (the setting before it is restored)."""
    try:
        return runtime.schedules.delete(session, schedule_id, actor, reason)
    except ScheduleNotFound as exc:
        raise HTTPException(404, str(exc)) from None


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/schedules", ["GET", "POST"])
answer_other_methods(router, "/admin/schedules/{schedule_id}", ["GET", "DELETE"])
