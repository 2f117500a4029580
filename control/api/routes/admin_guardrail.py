"""``/admin/guardrail``: the SLO guardrail's config (mode, objectives, bounds), its status,
and its decisions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from control.api.allow import answer_other_methods
from control.api.deps import ActorDep, AdminDep, RuntimeDep, SessionDep
from control.api.errors import validation_error
from control.guardrail.schemas import DecisionList, GuardrailUpdate, GuardrailView
from control.policy.store import SettingsInvalid
from control.schemas.errors import ADMIN_ERRORS, BAD_BODY

admin = APIRouter(
    prefix="/admin/guardrail", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS
)


@admin.get("", response_model=GuardrailView)
def get_guardrail(runtime: RuntimeDep, session: SessionDep) -> GuardrailView:
    return runtime.guardrail.view(session)


@admin.put("", response_model=GuardrailView, responses=BAD_BODY)
def put_guardrail(
    body: GuardrailUpdate, runtime: RuntimeDep, session: SessionDep, actor: ActorDep
) -> GuardrailView:
    """Store the whole config as a new revision (actor from ``X-Servedeck-Actor``); 422
    names each bad field, bounds above the engine caps included."""
    try:
        return runtime.guardrail.put(session, body, actor)
    except SettingsInvalid as exc:
        raise validation_error(exc, "body") from None


@admin.get("/decisions", response_model=DecisionList)
def get_decisions(
    runtime: RuntimeDep,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> DecisionList:
    """The newest decisions first."""
    return runtime.guardrail.decisions(session, limit)


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/guardrail", ["GET", "PUT"])
