"""The demo load a server sends itself (``--demo-load R``, which ``make run`` passes): the load
generator (``bench.load``) at a gentle Poisson rate against the server's own ``/v1``, so a
newcomer sees batching happen in the console within seconds. Off unless asked for, so a
production server never generates traffic.

What it sends is decided once, at start (``demo_prompts``): real chat requests (the shipped
``bench/demo_prompts.json``: varied short questions, a third behind one long shared system
prompt, so the console shows prefix-cached blocks) where the served model has a chat template,
which the embedded SmolLM2-135M-Instruct has; otherwise token-id prompts to
``/v1/completions``, which every model takes (one log line says why), since a chat request
to a model without a template is a 400. It runs on its own thread and event loop; the
console pauses and resumes it over HTTP (``PUT /admin/demo-load``, rate 0 pauses).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from bench.chat_prompts import ChatPrompts
from bench.load import LoadConfig, LoadGenerator
from control.chat.template import find_template
from control.schemas.demo_load import DemoLoadView
from engine.front import EngineFront
from sim.trace import Uniform

log = logging.getLogger(__name__)

DEMO_PROMPT_TOKENS = Uniform(32, 256)
DEMO_OUTPUT_TOKENS = Uniform(32, 128)
STOP_TIMEOUT_S = 5.0


def demo_prompts(front: EngineFront) -> ChatPrompts | None:
    """The shipped chat prompts where the served model renders chats (its template is found
    where the chat route looks: ``--tokenizer``'s folder, else the model's), else None."""
    model_dir = Path(front.config.tokenizer or front.config.model)
    if find_template(model_dir) is None:
        log.info(
            "the demo load sends token-id prompts to /v1/completions: %s has no chat template",
            model_dir.name,
        )
        return None
    return ChatPrompts.shipped()


class DemoLoad:
    def __init__(
        self, url: str, api_key: str | None, rate: float, prompts: ChatPrompts | None = None
    ) -> None:
        """``prompts``: the chat conversations to send, or None for token-id prompts."""
        config = LoadConfig(
            url=url,
            api_key=api_key,
            rate=rate,
            duration_s=None,
            prompt_tokens=DEMO_PROMPT_TOKENS,
            output_tokens=DEMO_OUTPUT_TOKENS,
            keep_records=False,
            chat_prompts=prompts,
        )
        self._generator = LoadGenerator(config, quiet=True)
        self._start_rate = rate
        self._loop = asyncio.new_event_loop()
        self._runner = asyncio.Runner(loop_factory=lambda: self._loop)
        self._task: asyncio.Task[object] | None = None
        self._thread = threading.Thread(target=self._run, name="servedeck-demo-load", daemon=True)

    def start(self) -> DemoLoad:
        self._thread.start()
        return self

    def _run(self) -> None:
        """The generator on this thread's own loop. The runner's close cancels whatever is
        left and closes the async generators, so no task is destroyed pending."""
        with self._runner as runner:
            try:
                runner.run(self._main())
            except asyncio.CancelledError:
                pass  # stop() cut the requests in flight off
            except Exception:
                log.exception("the demo load stopped")

    async def _main(self) -> None:
        self._task = asyncio.current_task()
        await self._generator.run()

    def _call(self, callback: Callable[[], object]) -> None:
        """``callback`` on the demo's loop, if it still runs."""
        with contextlib.suppress(RuntimeError):  # its loop has closed: nothing to tell
            self._loop.call_soon_threadsafe(callback)

    def set_rate(self, rate: float) -> None:
        self._call(lambda: self._generator.set_rate(rate))

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

    def stop_sending(self) -> None:
        """Send nothing new; the requests in flight go on (a drain waits for them like any
        other). Returns at once."""
        self._call(self._generator.stop)

    def stop(self) -> None:
        """Send nothing new and cut the requests in flight off (their streams close); waits
        for the thread up to ``STOP_TIMEOUT_S``."""
        if not self._thread.is_alive():
            return

        def cancel() -> None:
            self._generator.stop()
            if self._task is not None:
                self._task.cancel()

        self._call(cancel)
        self._thread.join(STOP_TIMEOUT_S)
