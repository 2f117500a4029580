"""Build the FastAPI app and run it under uvicorn: one process, one worker, one engine.

Shutdown is graceful: the first SIGTERM or SIGINT turns ``/ready`` 503 and refuses new
requests while the listener stays open (so the orchestrator sees the drain), the requests in
flight finish for up to ``drain_timeout_s``, then uvicorn stops and the database is closed
with its WAL checkpointed. A second signal stops at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import stat
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

import control.models  # noqa: F401  (tables on SQLModel.metadata before anything queries)
from control import migrate
from control.api import errors, openapi
from control.api.main import api_router
from control.api.middleware import RequestGuard
from control.api.request_context import install_log_filter
from control.api.routes import admin_policy
from control.context import AppContext
from control.core.config import Settings
from control.core.db import make_engine
from engine.config import EngineLimits

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5
"""After the drain: how long uvicorn lets open responses end before it cancels them."""
MIN_ADMIN_TOKEN_LEN = 16


class AdminTokenError(ValueError):
    """An admin token the server refuses to start with (the message never holds the token)."""


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
    openapi.document_limits(
        app,
        settings.max_stop_strings,
        settings.max_stop_length,
        settings.max_batch_prompts,
        lambda: _vocab_size(app),
    )
    admin_policy.document_policy_caps(app, lambda: _engine_limits(app))
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        max_json_depth=settings.max_json_depth,
    )
    if origins := settings.cors_origins():  # CORS stays off unless configured
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "If-Match", "X-Request-Id"],
            expose_headers=["ETag", "X-Request-Id", "Retry-After"],
        )
    install_log_filter()
    return app


def _vocab_size(app: FastAPI) -> int | None:
    ctx = getattr(app.state, "ctx", None)
    runtime = None if ctx is None else ctx.runtime
    return None if runtime is None else runtime.service.front.vocab_size


def _engine_limits(app: FastAPI) -> EngineLimits | None:
    ctx = getattr(app.state, "ctx", None)
    runtime = None if ctx is None else ctx.runtime
    return None if runtime is None else runtime.service.front.limits


def token_file(db_path: Path) -> Path:
    return db_path.with_name(f"{db_path.stem}.admin-token")


def resolve_admin_token(settings: Settings) -> str:
    """``--admin-token`` / ``SERVEDECK_ADMIN_TOKEN``, else ``--admin-token-file`` /
    ``SERVEDECK_ADMIN_TOKEN_FILE``, else the token file beside the database, else a new
    token: printed once and written to that file, readable by its owner only. A token
    shorter than 16 characters is refused (``AdminTokenError``)."""
    if settings.admin_token is not None:
        return checked_token(settings.admin_token.get_secret_value(), "--admin-token")
    if settings.admin_token_file is not None:
        return read_token_file(settings.admin_token_file)
    path = token_file(settings.db_path())
    if path.is_file():
        print(f"admin token: read from {path}", flush=True)
        return read_token_file(path)
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    print(f"admin token (saved to {path}): {token}", flush=True)
    return token


def checked_token(token: str, source: str) -> str:
    if not token:
        raise AdminTokenError(f"the admin token from {source} is empty")
    if len(token) < MIN_ADMIN_TOKEN_LEN:
        raise AdminTokenError(
            f"the admin token from {source} is shorter than {MIN_ADMIN_TOKEN_LEN} characters"
        )
    return token


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text().strip()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise AdminTokenError(f"cannot read the admin token file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "the admin token file %s is open to group or others (mode %o): chmod 600 it",
            path,
            mode,
        )
    return checked_token(token, str(path))


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains before the listener closes."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], object]) -> None:
        super().__init__(config)
        self._drain = drain
        self._draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._draining = True
        name = signal.Signals(sig).name
        drainer = threading.Thread(
            target=self._drain_then_exit, args=(name,), name="servedeck-drain", daemon=True
        )
        drainer.start()

    def _drain_then_exit(self, signal_name: str) -> None:
        log.info("%s: draining before shutdown", signal_name)
        try:
            self._drain()
        finally:
            self.should_exit = True


def serve(settings: Settings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Not a line per run of the every-second jobs; failures still come through our listener.
    logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)
    try:
        token = resolve_admin_token(settings)
    except AdminTokenError as exc:
        print(f"servedeck serve: {exc}", file=sys.stderr)
        return 2
    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    def drain() -> None:
        ctx = getattr(app.state, "ctx", None)
        if ctx is not None:
            ctx.drain(settings.drain_timeout_s)

    app = create_app(settings, token, on_load_failure=stop)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = DrainingServer(config, drain)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C, re-raised by uvicorn
        server.run()
    ctx = getattr(app.state, "ctx", None)
    return 1 if ctx is None or ctx.load_error is not None else 0
