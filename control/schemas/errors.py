"""Error bodies: ``/v1``'s in OpenAI's shape, the admin routes' ``detail``, and the responses
every admin route declares."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)


class ErrorInfo(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error.")
    param: str | None = Field(None, description="The request field at fault, if one is.")
    code: str | None = Field(None, description="A stable name for the refusal, if one fits.")


class ErrorResponse(BaseModel):
    """OpenAI's error body: every refusal and failure on ``/v1`` answers with it."""

    error: ErrorInfo


class AdminError(BaseModel):
    """Every admin refusal but 422: ``{"detail": "message"}``."""

    detail: str


Responses = dict[int | str, dict[str, Any]]
"""FastAPI's ``responses=`` mapping, its own type (Any: OpenAPI fragments)."""

ADMIN_ERRORS: Responses = {
    401: {"model": AdminError, "description": "No bearer token (WWW-Authenticate: Bearer)."},
    403: {"model": AdminError, "description": "The bearer token is not this server's."},
    503: {
        "model": AdminError,
        "description": "Loading, shutting down, the engine is slow, or the store refused a "
        "write (`store unavailable: ` and SQLite's reason, e.g. `database or disk is full`).",
    },
}
"""What every admin route may answer besides its own codes (422 FastAPI declares itself)."""


BAD_BODY: Responses = {400: {"model": AdminError, "description": "The body is not valid JSON."}}


class StoreUnavailableError(AdminError):
    """A 503 of a policy change: ``detail`` names the cause; when the store refused the
    version's state after storing it, ``stored`` is true with the ``version`` and its
    ``state`` as it reads now (``pending``: the reconcile job records it once it can)."""

    stored: bool = Field(False, description="Whether a new version was stored.")
    version: int | None = Field(None, description="The version stored, if one was.")
    state: Literal["pending"] | None = Field(
        None, description="The stored version's state in the store (its state write failed)."
    )
    in_force: bool | None = Field(None, description="Whether the engine runs that version.")


STORE_UNAVAILABLE: Responses = {
    503: {
        "model": StoreUnavailableError,
        "description": "Loading, shutting down, the engine is slow, or the store refused a "
        "write: `detail` names the cause; `stored` says whether the version was stored "
        "(then it is `pending` until the reconcile job records its state).",
    }
}
