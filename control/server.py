"""Build the FastAPI app and run it under uvicorn: one process, one worker, one engine."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI

import control.models  # noqa: F401  (tables on SQLModel.metadata before anything queries)
from control import migrate
from control.api import errors, limits
from control.api.main import api_router
from control.api.middleware import RequestGuard, install_log_filter
from control.core.config import Settings
from control.core.db import make_engine
from control.runtime import AppContext

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5


def create_app(
    settings: Settings, admin_token: str, on_load_failure: Callable[[], None] | None = None
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db_path = settings.db_path()
        migrate.upgrade(db_path)
        ctx = AppContext(settings, admin_token, make_engine(db_path))
        app.state.ctx = ctx

        def load() -> None:
            ctx.load()
            if ctx.runtime is not None:
                limits.max_prompt_bytes(ctx.runtime.llm_engine)  # once, before traffic
            if ctx.load_error is not None and on_load_failure is not None:
                on_load_failure()

        loader = threading.Thread(target=load, name="servedeck-loader", daemon=True)
        loader.start()
        try:
            yield
        finally:
            loader.join()
            ctx.close()

    app = FastAPI(
        title="servedeck",
        summary="LLM serving with switchable batching policies.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.include_router(api_router)
    if settings.testing:
        from control.api.routes import testing

        app.include_router(testing.router)
    errors.install(app)
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        max_json_depth=settings.max_json_depth,
    )
    install_log_filter()
    return app


def token_file(db_path: Path) -> Path:
    return db_path.with_name(f"{db_path.stem}.admin-token")


def resolve_admin_token(settings: Settings) -> str:
    """``--admin-token`` / ``SERVEDECK_ADMIN_TOKEN``, else the token file beside the database,
    else a new token: printed once and written to that file, readable by its owner only."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value()
    path = token_file(settings.db_path())
    if path.is_file():
        print(f"admin token: read from {path}", flush=True)
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    print(f"admin token (saved to {path}): {token}", flush=True)
    return token


def serve(settings: Settings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    token = resolve_admin_token(settings)
    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, token, on_load_failure=stop)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # re-raised by uvicorn after a clean stop
        server.run()
    ctx = getattr(app.state, "ctx", None)
    return 1 if ctx is None or ctx.load_error is not None else 0
