"""What one server process holds from its start: the app context (settings, database, metrics)
and, once the model has loaded, the runtime (``control.runtime``).

The model loads on a thread after the server started listening, so ``GET /health`` can
answer 503 meanwhile; everything else that needs the engine waits for ``ctx.runtime``.
``AppContext.not_ready`` says why ``GET /ready`` is 503 (loading, failed, draining, stalled).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from sqlalchemy import Engine

from control.compose import build_runtime
from control.core.config import Settings
from control.jobs.demo_load import DemoLoad, demo_prompts
from control.metrics import ControlMetrics
from control.runtime import Runtime
from control.schemas.health import NotReady

log = logging.getLogger(__name__)


@dataclass
class AppContext:
    settings: Settings
    admin_token: str
    db: Engine
    metrics: ControlMetrics = field(default_factory=ControlMetrics)
    runtime: Runtime | None = None
    load_error: str | None = None
    draining: threading.Event = field(default_factory=threading.Event)
    """Set on SIGTERM: /ready is 503 and new requests are refused while in-flight ones end."""
    demo_load: DemoLoad | None = None
    """The load the server sends itself with ``--demo-load`` (started once the model loaded)."""

    def load(self) -> None:
        """Load the model and start everything that needs it (runs on a loader thread)."""
        try:
            self.runtime = build_runtime(self.settings, self.db, self.metrics)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("could not start the engine")
            return
        if (rate := self.settings.demo_load) is not None:
            key = self.settings.api_key
            api_key = key.get_secret_value() if key is not None else None
            prompts = demo_prompts(self.runtime.service.front)
            url = self.settings.local_url()
            self.demo_load = DemoLoad(url, api_key, rate, prompts).start()
            log.info(
                "sending a demo load of %g requests/s to itself (%s)",
                rate,
                "chat prompts" if prompts is not None else "token-id prompts",
            )

    def not_ready(self) -> NotReady | None:
        """Why the server should get no new traffic now; None when it is ready."""
        runtime = self.runtime
        if self.draining.is_set():
            return NotReady(reason="draining", detail="shutting down: in-flight requests finish")
        if runtime is None and self.load_error is None:
            return NotReady(reason="loading", detail="the model is still loading")
        if runtime is None or not runtime.service.is_running:
            return NotReady(reason="failed", detail=self.load_error or "the engine loop stopped")
        if (stall := runtime.watchdog.stall) is not None:
            return NotReady(reason="stalled", detail=stall)
        return None

    def drain(self, timeout: float) -> bool:
        """Refuse new work, then wait up to ``timeout`` for the requests in flight."""
        self.draining.set()
        if self.demo_load is not None:
            self.demo_load.stop_sending()  # its requests in flight drain like the others
        if self.runtime is None:
            return True
        log.info("draining: waiting up to %.0f s for the requests in flight", timeout)
        drained = self.runtime.wait_idle(timeout)
        if not drained:
            cut = self.runtime.service.cut_off(
                f"the server shut down before the request finished (its drain timeout of "
                f"{timeout:g} s passed); retry the request"
            )
            log.warning(
                "drain timeout after %g s: %d request(s) still in flight cut off (engine_stopped)",
                timeout,
                cut,
            )
        return drained

    def close(self) -> None:
        if self.demo_load is not None:
            self.demo_load.stop()
        if self.runtime is not None:
            self.runtime.close()
        checkpoint(self.db)
        self.db.dispose()


def checkpoint(db: Engine) -> None:
    """Fold the WAL back into the database file, so a closed database is one clean file."""
    try:
        with db.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    except Exception:
        log.exception("WAL checkpoint at shutdown failed")
