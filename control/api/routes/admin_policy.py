"""``/admin/policy``: the settings in force, their schema, changes, history and rollback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Path, Query, Request, Response

from control.api.allow import answer_other_methods
from control.api.deps import (
    ActorDep,
    AdminDep,
    IfMatchDep,
    RuntimeDep,
    SessionDep,
)
from control.api.errors import validation_error
from control.models import SQLITE_INTEGER_MAX
from control.schemas import (
    ADMIN_ERRORS,
    BAD_BODY,
    CONFLICT,
    NOT_FOUND,
    STORE_UNAVAILABLE,
    EngineLimitsView,
    PolicyHistory,
    PolicySchema,
    PolicyUpdate,
    PolicyUpdateResult,
    PolicyView,
    RollbackRequest,
)
from control.store import SettingsInvalid
from engine.config import EngineLimits
from policies.registry import POLICIES, params_schemas

admin = APIRouter(
    prefix="/admin/policy", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS
)


@admin.get("", response_model=PolicyView)
def get_policy(runtime: RuntimeDep, session: SessionDep, response: Response) -> PolicyView:
    view = runtime.store.view(session)
    response.headers["ETag"] = f'"{view.version}"'
    return view


@admin.get("/schema", response_model=PolicySchema)
def get_schema(runtime: RuntimeDep) -> PolicySchema:
    limits = runtime.service.front.limits
    return PolicySchema(
        policies=params_schemas(),
        engine_limits=EngineLimitsView(
            block_size=limits.block_size,
            num_kv_blocks=limits.num_kv_blocks,
            max_model_len=limits.max_model_len,
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
        ),
    )


async def checked_update(request: Request, runtime: RuntimeDep) -> PolicyUpdate:
    """Validate the whole body here, before FastAPI does: pydantic alone cannot check policy
    params against the live engine's caps, and one 422 must name every failing field."""
    try:
        raw: Any = await request.json()
    except ValueError:
        raw = None
    try:
        return runtime.store.validate(raw)
    except SettingsInvalid as exc:
        raise validation_error(exc, "body") from None


@admin.put("", response_model=PolicyUpdateResult, responses=BAD_BODY | CONFLICT | STORE_UNAVAILABLE)
def put_policy(
    update: Annotated[PolicyUpdate, Depends(checked_update)],
    body: PolicyUpdate,  # checked above; declared so the OpenAPI schema shows the body
    runtime: RuntimeDep,
    session: SessionDep,
    if_match: IfMatchDep,
    actor: ActorDep,
    response: Response,
    dry_run: Annotated[
        bool,
        Query(
            description="Validate and diff; store nothing. The answer's `prediction` has the "
            "simulator's figures for the current and this setting on the recorded traffic "
            "(run in a separate process, capped in requests and time), or why there are none."
        ),
    ] = False,
) -> PolicyUpdateResult:
    try:
        result = runtime.store.update(session, update, actor, if_match, dry_run)
    except SettingsInvalid as exc:
        raise validation_error(exc, "body") from None
    if dry_run and runtime.predictor is not None:
        current = runtime.store.view(session).settings  # what the diff compares against
        result.prediction = runtime.predictor.predict(runtime.arrivals, current, result.settings)
    response.headers["ETag"] = f'"{result.version}"'
    return result


@admin.get("/history", response_model=PolicyHistory)
def get_history(
    runtime: RuntimeDep,
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=SQLITE_INTEGER_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> PolicyHistory:
    return runtime.store.history(session, offset, limit)


@admin.post(
    "/rollback/{version}",
    response_model=PolicyUpdateResult,
    responses=BAD_BODY | NOT_FOUND | CONFLICT | STORE_UNAVAILABLE,
)
def rollback(
    version: Annotated[int, Path(ge=1, le=SQLITE_INTEGER_MAX)],
    runtime: RuntimeDep,
    session: SessionDep,
    if_match: IfMatchDep,
    actor: ActorDep,
    response: Response,
    body: Annotated[RollbackRequest | None, Body()] = None,
) -> PolicyUpdateResult:
    reason = body.reason.strip() if body is not None and body.reason else None
    try:
        result = runtime.store.rollback(session, version, actor, reason, if_match)
    except SettingsInvalid as exc:
        raise validation_error(exc, "path") from None
    response.headers["ETag"] = f'"{result.version}"'
    return result


POLICY_SPEC_BODIES = ("PolicyUpdate", "ScheduleCreate")
"""Request bodies whose ``policy`` is a spec the engine caps bound."""


def document_policy_caps(app: FastAPI, limits: Callable[[], EngineLimits | None]) -> None:
    """Make ``app.openapi()`` show the engine caps of the capped policy params (a value above
    one is 422) as their ``maximum`` wherever a policy spec is taken (``PolicyUpdate``,
    ``ScheduleCreate``), once the engine is loaded; until then the schema is not cached."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        known = limits()
        if known is None:
            app.openapi_schema = None
            return schema
        for model in POLICY_SPEC_BODIES:
            policy = schema["components"]["schemas"][model]["properties"]["policy"]
            for branch in policy.get("anyOf", [policy])[0]["oneOf"]:
                params = branch["properties"]["params"]["properties"]
                name = branch["properties"]["name"]["const"]
                for field, limit in POLICIES[name].params_model.caps.items():
                    for typed in params[field].get("anyOf", [params[field]]):
                        if typed.get("type") == "integer":
                            typed["maximum"] = min(typed["maximum"], getattr(known, limit))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/policy", ["GET", "PUT"])
