"""The demo load a server sends itself (``--demo-load R``, which ``make run`` passes): the load
generator (``bench.load``) at a gentle Poisson rate against the server's own ``/v1``, so a
newcomer sees batching happen in the console within seconds. Off unless asked for, so a
production server never generates traffic. It runs on its own thread and event loop; the
console pauses and resumes it over HTTP (``PUT /admin/demo-load``, rate 0 pauses).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from bench.load import LoadConfig, LoadGenerator
from control.schemas.demo_load import DemoLoadView
from sim.trace import Uniform

log = logging.getLogger(__name__)

DEMO_PROMPT_TOKENS = Uniform(32, 256)
DEMO_OUTPUT_TOKENS = Uniform(32, 128)
STOP_TIMEOUT_S = 5.0


class DemoLoad:
    def __init__(self, url: str, api_key: str | None, rate: float) -> None:
        config = LoadConfig(
            url=url,
            api_key=api_key,
            rate=rate,
            duration_s=None,
            prompt_tokens=DEMO_PROMPT_TOKENS,
            output_tokens=DEMO_OUTPUT_TOKENS,
            keep_records=False,
        )
        self._generator = LoadGenerator(config, quiet=True)
        self._start_rate = rate
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="servedeck-demo-load", daemon=True)

    def start(self) -> DemoLoad:
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._generator.run())
        except Exception:
            log.exception("the demo load stopped")
        finally:
            self._loop.close()

    def set_rate(self, rate: float) -> None:
        self._loop.call_soon_threadsafe(self._generator.set_rate, rate)

    def view(self) -> DemoLoadView:
        generator = self._generator
        return DemoLoadView(
            enabled=True,
            rate=generator.rate or 0.0,
            start_rate=self._start_rate,
            sent=generator.sent,
            completed=generator.completed,
            failed=generator.failed,
            running=self._thread.is_alive(),
        )

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._generator.stop)
            self._thread.join(STOP_TIMEOUT_S)
