"""``/admin/schedules``: policy windows (cron start, wall-time end), audited like policy
changes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from control.api.allow import answer_other_methods
from control.api.deps import ActorDep, AdminDep, RuntimeDep, SessionDep
from control.api.errors import validation_error
from control.api.routes.admin_policy import body_of, json_body
from control.models import SQLITE_INTEGER_MAX
from control.policy.checks import parse_body
from control.policy.store import SettingsInvalid
from control.schedules.schemas import ScheduleCreate, ScheduleDetail, ScheduleList, ScheduleView
from control.schedules.store import ScheduleNotFound
from control.schemas.errors import ADMIN_ERRORS, BAD_BODY, AdminError, Responses

NO_SCHEDULE: Responses = {404: {"model": AdminError, "description": "No such schedule."}}
ScheduleId = Annotated[int, Path(ge=1, le=SQLITE_INTEGER_MAX)]

admin = APIRouter(
    prefix="/admin/schedules", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS
)


# Any: the request body before validation, JSON
def checked_schedule(
    raw: Annotated[Any, Depends(json_body)], runtime: RuntimeDep
) -> ScheduleCreate:
    """The POST body, validated once against the live engine's caps (one 422 names every
    failing field)."""
    try:
        return parse_body(ScheduleCreate, raw, runtime.store.limits)
    except SettingsInvalid as exc:
        raise validation_error(exc, "body") from None


@admin.post(
    "",
    response_model=ScheduleView,
    status_code=201,
    responses=BAD_BODY,
    openapi_extra=body_of(ScheduleCreate),
)
def create_schedule(
    body: Annotated[ScheduleCreate, Depends(checked_schedule)],
    runtime: RuntimeDep,
    session: SessionDep,
    actor: ActorDep,
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
