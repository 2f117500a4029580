"""The stall watchdog: a small job that reads the engine loop's health every second or so.

A loop that has work but made no progress for ``stall_timeout_s`` is *stalled*: ``GET /ready``
answers 503 with the reason (an orchestrator stops routing to it), the counter
``servedeck_engine_stalls_total`` goes up once per stall, and the log names the step that hung.
When the loop moves again, the server is ready again.
"""

from __future__ import annotations

import logging

from control.metrics import ControlMetrics
from control.service.protocol import EngineService

log = logging.getLogger(__name__)

JOB_ID = "stall_watchdog"
CHECK_INTERVAL_S = 1.0


def check_interval(stall_timeout_s: float) -> float:
    """Often enough to notice a stall within a fraction of the timeout."""
    return min(CHECK_INTERVAL_S, max(stall_timeout_s / 4, 0.1))


class StallWatchdog:
    def __init__(self, engine: EngineService, metrics: ControlMetrics, stall_timeout_s: float):
        self._engine = engine
        self._metrics = metrics
        self.stall_timeout_s = stall_timeout_s
        self.stall: str | None = None
        """While stalled: what hung and since when, for /ready and the log."""

    def check(self) -> None:
        health = self._engine.loop_health()
        since = health.seconds_since_progress
        stuck = health.alive and health.busy and since > self.stall_timeout_s
        if stuck and self.stall is None:
            self.stall = (
                f"the engine loop made no progress for {since:.1f} s "
                f"(over {self.stall_timeout_s:g} s), hung in {health.describe()}"
            )
            self._metrics.count_stall()
            log.error("engine stalled: %s", self.stall)
        elif not stuck and self.stall is not None:
            log.warning("engine progressing again (step %d) after: %s", health.step, self.stall)
            self.stall = None
