"""One engine in this process: the ``EngineService`` of a server without ``--replicas``.

``AsyncEngine`` steps the ``LLMEngine`` on its own thread; this class adds what the control
plane asks beyond requests: a stored version put in force (the policy and the memory reserve,
at the engine's step boundary, with the commands of a version still pending kept so that a
retry waits on them instead of sending them again), the sweep, the snapshot, the memory trim
job, and the test hooks (``TestingHooks``, handed out by the composition root only under
``SERVEDECK_TESTING=1``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from control.jobs.memory_trim import JOB_ID as MEMORY_TRIM_JOB_ID
from control.jobs.memory_trim import TICK_S as MEMORY_TRIM_TICK_S
from control.jobs.memory_trim import MemoryTrim
from control.policy.schemas import PolicySettings
from control.service.protocol import EngineService, PeriodicJob, ReplicaControl
from engine.front import EngineFront, QueuedPrompt
from engine.kv_stats import KVIntegrity, ReclaimResult
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.timeline import RequestTimeline
from serving.async_engine import AsyncEngine, RequestStream
from serving.engine import LLMEngine
from serving.loop_health import LoopHealth
from serving.snapshot import EngineSnapshot


class Awaited(Protocol):
    """A command's future as a pending version waits on it (whatever its result)."""

    def result(self, timeout: float | None = None) -> object: ...


@dataclass
class _Pending:
    """A version handed to the engine and not yet confirmed: a retry waits on the same
    commands instead of sending them again."""

    version: int
    futures: list[Awaited]


class LocalEngine(EngineService):
    def __init__(
        self,
        engine: LLMEngine,
        in_force: PolicySettings,
        on_finished: Callable[[RequestOutput], None] | None = None,
    ) -> None:
        self._engine = engine
        self._loop = AsyncEngine(engine, on_finished=on_finished)
        self._in_force = in_force
        """What the engine runs now (the last version it confirmed)."""
        self._pending: _Pending | None = None
        self._lock = threading.Lock()

    @property
    def front(self) -> EngineFront:
        return self._engine.front

    @property
    def is_running(self) -> bool:
        return self._loop.is_running

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.shutdown()

    # -- requests ------------------------------------------------------------------------

    def add_request(
        self, token_ids: list[int], params: SamplingParams, request_id: str
    ) -> RequestStream:
        return self.add_requests([QueuedPrompt(token_ids, params, request_id)])[0]

    def add_requests(self, batch: Sequence[QueuedPrompt]) -> list[RequestStream]:
        return self._loop.add_requests(batch)

    def in_flight(self) -> bool:
        return self._engine.has_unfinished_requests()

    def cut_off(self, reason: str) -> int:
        return self._loop.cut_off(reason)

    # -- settings, maintenance and state -------------------------------------------------

    def apply(self, settings: PolicySettings, version: int, timeout: float) -> None:
        with self._lock:
            pending = self._pending
            if pending is None or pending.version != version:
                pending = self._pending = _Pending(version, self._submit(settings, version))
            deadline = time.monotonic() + timeout
            try:
                for future in pending.futures:
                    future.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise
            except BaseException:
                self._pending = None
                raise
            self._pending = None
            self._in_force = settings

    def _submit(self, settings: PolicySettings, version: int) -> list[Awaited]:
        futures: list[Awaited] = []
        if settings.policy != self._in_force.policy or settings.queue != self._in_force.queue:
            futures.append(
                self._engine.set_policy(settings.policy, version=version, queue=settings.queue)
            )
        if settings.memory_reserve != self._in_force.memory_reserve:
            futures.append(self._engine.set_memory_reserve(settings.memory_reserve))
        return futures

    def reclaim(self) -> Future[ReclaimResult]:
        return self._engine.reclaim()

    def snapshot(self, timeout: float | None = 30.0) -> EngineSnapshot:
        return self._engine.snapshot(timeout)

    def check_kv_integrity(self, timeout: float) -> KVIntegrity:
        return self._engine.check_kv_integrity().result(timeout)

    def timeline(self, seq_id: str, timeout: float | None = 30.0) -> RequestTimeline | None:
        return self._engine.timeline(seq_id, timeout)

    def loop_health(self) -> LoopHealth:
        return self._loop.loop_health()

    def jobs(self) -> Sequence[PeriodicJob]:
        trim = MemoryTrim(self._loop.loop_health, self._engine.release_buffers)
        return (
            PeriodicJob(
                MEMORY_TRIM_JOB_ID, "give memory back after a load", trim.tick, MEMORY_TRIM_TICK_S
            ),
        )

    def replicas(self) -> ReplicaControl | None:
        return None

    # -- TestingHooks ----------------------------------------------------------------------

    def leak(self, request_id: str) -> bool:
        return self._loop.leak(request_id)

    def stall(self, seconds: float) -> Future[float]:
        return self._loop.stall(seconds)
