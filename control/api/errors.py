"""Engine and store refusals as HTTP answers: ``{"detail": ...}`` with the right status."""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from control.store import SettingsInvalid, VersionConflict, VersionNotFound
from engine.async_engine import EngineStepError, EngineStopped
from engine.errors import QueueFull, RequestRejected

RETRY_AFTER_S = 1


def validation_error(exc: SettingsInvalid, where: str) -> RequestValidationError:
    """The store's errors with ``loc`` under ``where`` (``body`` or ``path``)."""
    return RequestValidationError([{**e, "loc": (where, *e["loc"])} for e in exc.errors])


def _detail(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestRejected)
    async def rejected(_: Request, exc: RequestRejected) -> JSONResponse:
        message = str(exc)
        if exc.param not in message:
            message = f"{exc.param}: {message}"
        return _detail(400, message)

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, exc: QueueFull) -> JSONResponse:
        return _detail(429, str(exc), {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(VersionConflict)
    async def conflict(_: Request, exc: VersionConflict) -> JSONResponse:
        return _detail(409, str(exc))

    @app.exception_handler(VersionNotFound)
    async def not_found(_: Request, exc: VersionNotFound) -> JSONResponse:
        return _detail(404, str(exc))

    @app.exception_handler(EngineStopped)
    async def stopped(_: Request, exc: EngineStopped) -> JSONResponse:
        return _detail(503, str(exc), {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(EngineStepError)
    async def step_failed(_: Request, exc: EngineStepError) -> JSONResponse:
        return _detail(500, str(exc))

    @app.exception_handler(FutureTimeout)
    async def engine_timeout(_: Request, exc: Any) -> JSONResponse:
        return _detail(503, "the engine did not answer in time", {"Retry-After": "5"})
