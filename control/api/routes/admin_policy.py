"""``/admin/policy``: the settings in force, their schema, changes, history and rollback."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Path, Query, Request, Response
from pydantic import BaseModel

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
from control.policy.schemas import (
    CONFLICT,
    NOT_FOUND,
    EngineLimitsView,
    PolicyHistory,
    PolicySchema,
    PolicyUpdate,
    PolicyUpdateResult,
    PolicyView,
    RollbackRequest,
)
from control.policy.store import SettingsInvalid
from control.schedules.schemas import ScheduleCreate
from control.schemas.errors import ADMIN_ERRORS, BAD_BODY, STORE_UNAVAILABLE
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


# Any in this module: a request body before validation, and OpenAPI documents: JSON
async def json_body(request: Request) -> Any:
    """The request's JSON, unvalidated (None when it is none): a body that carries a policy
    spec is validated once, against the live engine's caps, by its route's dependency."""
    try:
        return await request.json()
    except ValueError:
        return None


def checked_update(raw: Annotated[Any, Depends(json_body)], runtime: RuntimeDep) -> PolicyUpdate:
    """The PUT body, validated once (``PolicyStore.validate``): one 422 names every failing
    field, policy params above the engine caps included."""
    try:
        return runtime.store.validate(raw)
    except SettingsInvalid as exc:
        raise validation_error(exc, "body") from None


def body_of(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route whose body a dependency validates: the body is ``model``
    (its schema joins the components, ``document_policy_caps``)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


@admin.put(
    "",
    response_model=PolicyUpdateResult,
    responses=BAD_BODY | CONFLICT | STORE_UNAVAILABLE,
    openapi_extra=body_of(PolicyUpdate),
)
def put_policy(
    update: Annotated[PolicyUpdate, Depends(checked_update)],
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


POLICY_SPEC_BODIES: tuple[type[BaseModel], ...] = (PolicyUpdate, ScheduleCreate)
"""Request bodies that carry a policy spec: validated by their route's dependency against the
engine caps, declared with ``body_of``; their schemas (validation mode) join the components
here, named as FastAPI names an input schema (``-Input``) where the model has one apart."""


def body_schemas(components: dict[str, Any]) -> None:
    """Add each of ``POLICY_SPEC_BODIES`` and the models it holds (validation schemas) to
    ``components``, in place; a held model whose name a response schema has already is added
    as ``<name>-Input``, as FastAPI names the input schema of a model used both ways."""
    taken = set(components)
    for model in POLICY_SPEC_BODIES:
        doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
        defs: dict[str, Any] = doc.pop("$defs", {})
        names = {name: f"{name}-Input" if name in taken else name for name in defs}
        for name, schema in [*defs.items(), (model.__name__, doc)]:
            text = json.dumps(schema)
            for old, new in names.items():
                text = text.replace(
                    f'"#/components/schemas/{old}"', f'"#/components/schemas/{new}"'
                )
            components[names.get(name, name)] = json.loads(text)


def document_policy_caps(app: FastAPI, limits: Callable[[], EngineLimits | None]) -> None:
    """Make ``app.openapi()`` hold the bodies that carry a policy spec (``body_schemas``) and
    show the engine caps of the capped policy params (a value above one is 422) as their
    ``maximum`` there, once the engine is loaded; until then the schema is not cached."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema["components"]["schemas"]
        body_schemas(components)
        known = limits()
        if known is None:
            app.openapi_schema = None
            return schema
        policy = components["PolicyUpdate"]["properties"]["policy"]["anyOf"][0]
        for name, ref in policy["discriminator"]["mapping"].items():
            spec = components[ref.rsplit("/", 1)[1]]
            params = components[spec["properties"]["params"]["$ref"].rsplit("/", 1)[1]]
            for field, limit in POLICIES[name].params_model.caps.items():
                prop = params["properties"][field]
                for typed in prop.get("anyOf", [prop]):
                    if typed.get("type") == "integer":
                        typed["maximum"] = min(typed["maximum"], getattr(known, limit))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


router = APIRouter()
router.include_router(admin)
answer_other_methods(router, "/admin/policy", ["GET", "PUT"])
