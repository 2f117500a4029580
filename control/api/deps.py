"""Dependencies of the routes: the app context, the loaded runtime, a DB session, admin auth
and the policy headers."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from control.api.errors import ApiError
from control.context import AppContext
from control.core.api_keys import ApiKey
from control.guardrail.rows import ACTOR as GUARDRAIL_ACTOR
from control.policy.rows import SEED_ACTOR
from control.requests_text import TextJournal
from control.runtime import Runtime
from control.schedules.store import ACTOR_PREFIX as SCHEDULE_ACTOR_PREFIX
from control.service.protocol import EngineService, ReplicaControl, TestingHooks

ACTOR_MAX_LEN = 100


def get_context(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx  # set by create_app (Starlette's state is untyped)
    return ctx


ContextDep = Annotated[AppContext, Depends(get_context)]


def get_runtime(ctx: ContextDep) -> Runtime:
    """The loaded runtime; 503 while loading, after a failed load, and while draining (every
    route that serves or changes something goes through here; /health, /ready and /metrics
    do not)."""
    if ctx.draining.is_set():
        raise HTTPException(503, "the server is shutting down", headers={"Retry-After": "5"})
    if ctx.runtime is None:
        detail = "the model is still loading" if ctx.load_error is None else "the engine failed"
        raise HTTPException(503, detail, headers={"Retry-After": "1"})
    return ctx.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_service(runtime: RuntimeDep) -> EngineService:
    return runtime.service


ServiceDep = Annotated[EngineService, Depends(get_service)]

NO_REPLICAS = "this server runs one engine: a restart needs --replicas"


def get_replicas(service: ServiceDep) -> ReplicaControl:
    """The fleet capability; 409 on a server of one engine."""
    replicas = service.replicas()
    if replicas is None:
        raise HTTPException(409, NO_REPLICAS)
    return replicas


ReplicasDep = Annotated[ReplicaControl, Depends(get_replicas)]

NO_TEST_HOOKS = "the test hooks need one local engine (not --replicas)"


def get_testing(runtime: RuntimeDep) -> TestingHooks:
    if runtime.testing is None:
        raise HTTPException(409, NO_TEST_HOOKS)
    return runtime.testing


TestingDep = Annotated[TestingHooks, Depends(get_testing)]


NO_TEXT = (
    "the server was started without --expose-text: it keeps no prompt or output text "
    "(restart it with --expose-text to see requests' text)"
)


def get_text(runtime: RuntimeDep) -> TextJournal:
    """The requests' text; 409 on a server started without ``--expose-text``."""
    if runtime.text is None:
        raise HTTPException(409, NO_TEXT)
    return runtime.text


TextDep = Annotated[TextJournal, Depends(get_text)]


def get_db(ctx: ContextDep) -> Iterator[Session]:
    with Session(ctx.db) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_db)]

_bearer = HTTPBearer(auto_error=False, description="The admin token.")


def require_admin(
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 without a bearer token, 403 with a wrong one (compared in constant time)."""
    if credentials is None:
        raise HTTPException(
            401,
            "admin token missing: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = credentials.credentials.encode()
    if not hmac.compare_digest(given, ctx.admin_token.encode()):
        raise HTTPException(403, "admin token is not valid for this server")


AdminDep = Depends(require_admin)


def require_api_key(ctx: ContextDep, request: Request) -> ApiKey | None:
    """With API keys set (``--api-key``, ``--api-key-file``), /v1 needs ``Authorization:
    Bearer <key>`` (compared in constant time); 401 in OpenAI's shape without it or with a
    wrong one. Returns the key (its tenant, if named), None when the server needs none. The
    header is read here, not through a security scheme: the key is optional per server, so
    ``/openapi.json`` declares the 401 and no scheme every request would have to satisfy."""
    keys = ctx.settings.api_keys()
    if keys is None:
        return None
    header = request.headers.get("authorization")
    scheme, _, given = (header or "").partition(" ")
    found = keys.match(given.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        problem = "missing" if header is None else "not valid"
        raise ApiError(
            401,
            f"API key {problem}: send 'Authorization: Bearer <key>'",
            code="invalid_api_key",
            reason="unauthorized",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return found


ApiKeyDep = Depends(require_api_key)
AuthKeyDep = Annotated[ApiKey | None, ApiKeyDep]
"""The key that authenticated the request (the router's own check, run once per request)."""


IF_MATCH_PATTERN = r'^\s*(\*|(W/)?"?[0-9]{1,19}"?)\s*$'
"""What If-Match takes: ``*`` (any), or a version ``N`` / ``"N"`` (a weak ``W/`` prefix ignored)."""


def if_match_version(
    if_match: Annotated[  # str, not str | None: the schema must offer no null to send
        str,  # noqa: RUF013
        Header(
            description='A version: N or "N" (or *: any).',
            json_schema_extra={"pattern": IF_MATCH_PATTERN},
        ),
    ] = None,  # type: ignore[assignment]  # None: header absent, yet the schema offers no null
) -> int | None:
    """Checked here, by the same pattern the schema shows, for an error naming the header."""
    if if_match is None:
        return None
    match = re.fullmatch(IF_MATCH_PATTERN, if_match)
    if match is None:
        raise RequestValidationError(
            [
                {
                    "type": "string_pattern_mismatch",
                    "loc": ("header", "if-match"),
                    "msg": 'If-Match must be a policy version: N or "N"',
                    "input": if_match,
                }
            ]
        )
    value = match.group(1)
    return None if value == "*" else int(value.removeprefix("W/").strip('"'))


IfMatchDep = Annotated[int | None, Depends(if_match_version)]


SYSTEM_ACTORS = frozenset((SEED_ACTOR, GUARDRAIL_ACTOR))
"""The names the server's own writes carry (the seed version, the guardrail's versions); with
``schedule:<id>`` (a window's), the window-end logic and the guardrail's rate limit read them."""


def reserved_actor(actor: str) -> bool:
    """Whether ``actor`` names the server itself (case aside: SQLite's LIKE ignores it)."""
    name = actor.strip().casefold()
    return name in SYSTEM_ACTORS or name.startswith(SCHEDULE_ACTOR_PREFIX)


def actor_of(
    x_servedeck_actor: Annotated[
        str | None,
        Header(
            max_length=ACTOR_MAX_LEN,
            description="Who makes the change (default admin); the server's own names "
            f"({', '.join(sorted(SYSTEM_ACTORS))}, {SCHEDULE_ACTOR_PREFIX}<id>) are refused.",
        ),
    ] = None,
) -> str:
    """The person a change is recorded under; 422 naming the header for a system actor, so the
    audit trail, a window's end and the guardrail's rate limit cannot be misled."""
    actor = (x_servedeck_actor or "").strip() or "admin"
    if reserved_actor(actor):
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("header", "x-servedeck-actor"),
                    "msg": f"X-Servedeck-Actor {actor!r} is reserved for the server's own changes",
                    "input": x_servedeck_actor,
                }
            ]
        )
    return actor


ActorDep = Annotated[str, Depends(actor_of)]
