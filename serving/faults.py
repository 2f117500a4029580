"""Fault injection, for testing only: faults that the maintenance sweep and the stall watchdog
must detect and repair. Nothing in the serving path calls these; the server exposes them only
under ``SERVEDECK_TESTING=1``.

Each fault is an engine command, applied on the engine's own thread at the next step boundary.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from engine.batch import ScheduledBatch, StepResult
from engine.runner import Runner

if TYPE_CHECKING:
    from serving.engine import LLMEngine


def leak_sequence(engine: LLMEngine, request_id: str) -> Future[bool]:
    """Drop a request but keep its blocks allocated (what the reclaim sweep must fix).
    Resolves to whether the request was live.

    Only the BlockManager's public API is used: the blocks are shared with a stand-in
    sequence while the policy drops the request, then handed back under the request's id.
    """
    stand_in = f"{request_id}\x00leaked"

    def leak() -> bool:
        blocks = engine.blocks
        held = blocks.holds(request_id)
        if held:
            blocks.fork(request_id, stand_in)
        seq = engine.policy.abort(request_id)  # frees the request's own references
        engine._sequences.pop(request_id, None)
        if held:
            if not blocks.holds(request_id):
                blocks.fork(stand_in, request_id)
            blocks.free(stand_in)
        return seq is not None

    return engine.commands.submit(leak)


def stall(engine: LLMEngine, seconds: float) -> Future[float]:
    """Block the engine loop for ``seconds``: from the next step boundary, the next step that
    runs a batch (requests in flight) sleeps that long before its forward, with the step's
    description published in ``engine.current_step`` as for a hung forward. Resolves to the
    seconds actually slept once the stall is over."""
    if not 0 <= seconds <= 3600:
        raise ValueError(f"seconds must be in [0, 3600], got {seconds}")
    done: Future[float] = Future()

    def arm() -> None:
        engine.runner = _StallingRunner(engine, engine.runner, seconds, done)

    engine.commands.submit(arm)
    return done


class _StallingRunner:
    """Wraps the engine's runner for one ``execute``: sleeps, restores the runner, runs it."""

    def __init__(
        self, engine: LLMEngine, inner: Runner, seconds: float, done: Future[float]
    ) -> None:
        self._engine = engine
        self._inner = inner
        self._seconds = seconds
        self._done = done

    def __getattr__(self, name: str) -> Any:  # last_forward_s, device, ... of the real runner
        return getattr(self._inner, name)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        started = time.monotonic()
        time.sleep(self._seconds)
        self._engine.runner = self._inner
        self._done.set_result(time.monotonic() - started)
        return self._inner.execute(batch)
