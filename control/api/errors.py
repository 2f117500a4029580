"""Every refusal and failure as an HTTP answer, in the shape its clients read.

On ``/v1`` the body is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (the
official ``openai`` client shows ``error.message``) and invalid values answer 400, as other
OpenAI-compatible servers do. Everywhere else (admin, health) the documented FastAPI shapes
stay: ``{"detail": "message"}``, and 422 with the list of validation errors. Neither rendering
can fail: non-finite floats and lone surrogates from the request are written as text.
"""

from __future__ import annotations

import math
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from control.api.request_context import note_refusal
from control.core.db import unavailable
from control.policy.store import SettingsInvalid, StoreUnavailable, VersionConflict, VersionNotFound
from control.schemas.errors import ErrorInfo, ErrorResponse, StoreUnavailableError
from engine.errors import EngineStepError, EngineStopped, QueueFull, RequestRejected

RETRY_AFTER_S = 1
STORE_RETRY_AFTER_S = 5
PUBLIC_PREFIX = "/v1"
MAX_LISTED_ERRORS = 3
_ERROR_TYPES = {429: "rate_limit_error", 401: "invalid_request_error"}


_PUBLIC_ERRORS = {
    400: "An invalid value, or a request that can never be served; `param` names the field.",
    401: "The API key is missing or wrong (only when the server has one).",
    404: "Unknown model.",
    413: "The body is larger than the server's `max_body_bytes`.",
    429: "The waiting queue is full, or no chat template worker was free; see Retry-After.",
    500: "The engine failed while running this request.",
    503: "The model is loading, or the server is shutting down; see Retry-After.",
}


# Any: FastAPI's responses= mapping (OpenAPI fragments), as control.schemas.errors.Responses
def public_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a ``/v1`` route: each status it answers, in OpenAI's shape
    (``default`` also keeps FastAPI from declaring a 422 that ``/v1`` never sends)."""
    responses: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorResponse, "description": _PUBLIC_ERRORS[status]}
        for status in statuses
    }
    responses["default"] = {"model": ErrorResponse, "description": "Any other refusal."}
    return responses


def is_public(path: str) -> bool:
    """Routes that answer in OpenAI's error shape."""
    return path == PUBLIC_PREFIX or path.startswith(PUBLIC_PREFIX + "/")


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


class ApiError(Exception):
    """A refusal carrying all its answer needs: status, field, a stable code, headers and the
    ``reason`` label it counts under (``servedeck_requests_refused_total``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        reason: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.reason = reason
        self.headers = headers


def printable(text: str) -> str:
    """``text`` with any lone surrogate written as ``\\udXXX`` (UTF-8 cannot encode one)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# Any: a pydantic error's input or context, whatever the client sent
def json_safe(value: Any) -> Any:
    """``value`` with NaN/Infinity as their repr and every string printable."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def error_response(
    path: str,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The answer for a refusal on ``path``: OpenAI's shape on ``/v1``, else ``detail``."""
    message = printable(message)
    if is_public(path):
        info = ErrorInfo(message=message, type=error_type(status), param=param, code=code)
        body: dict[str, Any] = ErrorResponse(error=info).model_dump()
    else:
        body = {"detail": message}
    return JSONResponse(body, status_code=status, headers=headers)


def validation_error(exc: SettingsInvalid, where: str) -> RequestValidationError:
    """The store's errors with ``loc`` under ``where`` (``body`` or ``path``)."""
    return RequestValidationError([{**e, "loc": (where, *e["loc"])} for e in exc.errors])


def _is_union_tag(part: str) -> bool:
    # pydantic names union members in ``loc``: "constrained-str", "list[int]", "str", "Model"
    return not part.isidentifier() or part in {"str", "int", "float", "bool"} or part[0].isupper()


# Any: a pydantic error's loc and entries (JSON)
def param_of(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """The request field an error's ``loc`` points at (``stream_options.include_usage``)."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else []
    names: list[str] = []
    for part in parts:
        if not isinstance(part, str) or _is_union_tag(part):
            break
        names.append(part)
    return ".".join(names) or None


def invalid_request(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A message naming the field and what is wrong with it, and that field."""
    param = param_of(errors[0].get("loc", ())) if errors else None
    messages: list[str] = []
    for error in errors:
        if param_of(error.get("loc", ())) != param:
            continue
        where = [str(p) for p in error.get("loc", ()) if isinstance(p, int)]
        text = str(error.get("msg", "invalid value")) + (f" (item {where[0]})" if where else "")
        if text not in messages:
            messages.append(text)
    listed = "; or ".join(messages[:MAX_LISTED_ERRORS]) or "invalid request"
    return (f"{param}: {listed}" if param else listed), param


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""OpenAI's code for a prompt (plus ``max_tokens``) that does not fit the context."""
_CONTEXT_WORDS = ("max_model_len", "KV pool")


def rejection_code(exc: RequestRejected) -> str:
    """``error.code`` of an engine refusal: the engine's own ``code`` when it gives one, else
    ``context_length_exceeded`` for a request past the context (``max_tokens``, or a prompt
    refused for ``max_model_len`` or the KV pool), else ``invalid_value``."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    message = str(exc)
    if exc.param == "max_tokens" or any(word in message for word in _CONTEXT_WORDS):
        return CONTEXT_LENGTH_EXCEEDED
    return "invalid_value"


def install(app: FastAPI) -> None:
    # Any: JSONResponse's own keyword arguments
    def answer(request: Request, status: int, message: str, **kwargs: Any) -> JSONResponse:
        return error_response(request.url.path, status, message, **kwargs)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if exc.reason is not None:
            note_refusal(exc.reason)
        return answer(
            request, exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if is_public(request.url.path):
            message, param = invalid_request(list(exc.errors()))
            return answer(request, 400, message, param=param, code="invalid_value")
        return JSONResponse({"detail": json_safe(jsonable_encoder(exc.errors()))}, 422)

    @app.exception_handler(StarletteHTTPException)
    # Any: the handler's answer, Starlette's own (a Response)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
        if not is_public(request.url.path):
            return await http_exception_handler(request, exc)
        return answer(request, exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestRejected)
    async def rejected(request: Request, exc: RequestRejected) -> JSONResponse:
        message = str(exc)
        if exc.param not in message:
            message = f"{exc.param}: {message}"
        return answer(request, 400, message, param=exc.param, code=rejection_code(exc))

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return answer(request, 429, str(exc), code="queue_full", headers=headers)

    @app.exception_handler(VersionConflict)
    async def conflict(request: Request, exc: VersionConflict) -> JSONResponse:
        return answer(request, 409, str(exc))

    @app.exception_handler(VersionNotFound)
    async def not_found(request: Request, exc: VersionNotFound) -> JSONResponse:
        return answer(request, 404, str(exc))

    @app.exception_handler(StoreUnavailable)
    async def policy_not_written(request: Request, exc: StoreUnavailable) -> JSONResponse:
        stored = exc.version is not None
        body = StoreUnavailableError(
            detail=printable(str(exc)),
            stored=stored,
            version=exc.version,
            state="pending" if stored else None,
            in_force=exc.in_force if stored else None,
        )
        headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
        return JSONResponse(body.model_dump(), status_code=503, headers=headers)

    @app.exception_handler(OperationalError)
    async def store_refused(request: Request, exc: OperationalError) -> JSONResponse:
        """A full disk, a read-only or locked database file: nothing was written."""
        headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
        return answer(request, 503, unavailable(exc), code="store_unavailable", headers=headers)

    @app.exception_handler(EngineStopped)
    async def stopped(request: Request, exc: EngineStopped) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return answer(request, 503, str(exc), code="engine_stopped", headers=headers)

    @app.exception_handler(EngineStepError)
    async def step_failed(request: Request, exc: EngineStepError) -> JSONResponse:
        return answer(request, 500, str(exc), code="engine_error")

    @app.exception_handler(FutureTimeout)
    # Any: Starlette hands the exception over untyped
    async def engine_timeout(request: Request, exc: Any) -> JSONResponse:
        message = "the engine did not answer in time"
        return answer(request, 503, message, code="engine_timeout", headers={"Retry-After": "5"})
