"""The engine seam: everything the routes, the jobs and the CLI ask of whatever runs the model.

``EngineService`` is the one interface above the engine. Two implementations exist:
``control.service.local.LocalEngine`` (one engine on a thread of this process) and
``control.fleet.fleet.Fleet`` (engine replicas on Ray Serve, behind a tokenizer-only front).
A third, an engine core in its own process, implements the same members; the composition root
(``control.compose``) is the one place that picks which. Routes and jobs import this module,
never an implementation (``tests/test_layering.py`` holds them to it).

A fleet's operations (its replicas, a rolling restart) are an optional capability:
``replicas()`` answers ``None`` where there are none, and the route that needs them answers
409. The test hooks (``leak``, ``stall``) are off this interface: ``TestingHooks``, which the
composition root hands out only under ``SERVEDECK_TESTING=1``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.front import EngineFront, QueuedPrompt
from engine.kv_stats import KVIntegrity, ReclaimResult
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.timeline import RequestTimeline
from serving.loop_health import LoopHealth
from serving.snapshot import EngineSnapshot

if TYPE_CHECKING:
    from control.fleet.schemas import ReplicaView, RestartView
    from control.policy.schemas import PolicySettings


class EngineStream(Protocol):
    """One request's outputs, in order; the last one has ``request_finished`` set."""

    request_id: str

    async def admitted(self) -> None:
        """Returns once the engine that serves the request took it in; the refusals that come
        only then (a replica's ``QueueFull``) raise here, so a route that awaits this before it
        answers still refuses with an HTTP error, never with an event."""
        ...

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    async def __anext__(self) -> RequestOutput: ...

    async def aclose(self) -> None:
        """Stop reading; an unfinished request is aborted."""
        ...


@dataclass(frozen=True, slots=True)
class PeriodicJob:
    """A light job an implementation needs run beside the sweep (``Maintenance.add_job``)."""

    job_id: str
    name: str
    run: Callable[[], None]
    interval_s: float


class ReplicaControl(Protocol):
    """A fleet's own operations: its replicas and rolling restarts."""

    def views(self) -> list[ReplicaView]: ...

    def restart(self) -> RestartView:
        """Start a rolling restart; ``RestartRefused`` while one runs or none is up."""
        ...

    def restart_view(self) -> RestartView | None:
        """The restart running now, or the last one (None: never restarted)."""
        ...


class TestingHooks(Protocol):
    """Faults the tests inject (serving/faults.py); mounted under ``SERVEDECK_TESTING=1`` only."""

    def leak(self, request_id: str) -> bool: ...

    def stall(self, seconds: float) -> Future[float]: ...


class EngineService(Protocol):
    @property
    def front(self) -> EngineFront:
        """Tokenizer, limits and admission checks: what a route needs before it queues."""
        ...

    @property
    def is_running(self) -> bool: ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    # -- requests ------------------------------------------------------------------------

    def add_request(
        self, token_ids: list[int], params: SamplingParams, request_id: str
    ) -> EngineStream:
        """Queue a request: the batch of one (``add_requests``)."""
        ...

    def add_requests(self, batch: Sequence[QueuedPrompt]) -> Sequence[EngineStream]:
        """Queue a batch whole or not at all, one stream per prompt in order (each prompt a
        request of its own). ``RequestRejected`` (naming the prompt) / ``QueueFull`` /
        ``EngineStopped`` at once, queueing none; where the serving engine takes the batch
        only later (a fleet's replicas), every stream's ``admitted()`` raises the batch's
        refusal and none stays queued. Call from a running event loop: the outputs are
        delivered to that loop."""
        ...

    def in_flight(self) -> bool:
        """Whether any request is still being served (a drain waits until not)."""
        ...

    def cut_off(self, reason: str) -> int:
        """A drain's deadline: end every request in flight now with ``EngineStopped(reason)``
        and refuse new ones the same way; how many were cut off."""
        ...

    # -- settings, maintenance and state -------------------------------------------------

    def apply(self, settings: PolicySettings, version: int, timeout: float) -> None:
        """Put a stored version in force at the engine's next step boundary. ``TimeoutError``
        when it has not been taken within ``timeout``: the commands stay queued and a retry of
        the same version waits on them; any other error means it was refused."""
        ...

    def reclaim(self) -> Future[ReclaimResult]:
        """One KV reclaim sweep (every replica's, summed)."""
        ...

    def snapshot(self, timeout: float | None = 30.0) -> EngineSnapshot:
        """The engine's state at a step boundary (``TimeoutError`` after ``timeout``)."""
        ...

    def check_kv_integrity(self, timeout: float) -> KVIntegrity: ...

    def timeline(self, seq_id: str, timeout: float | None = 30.0) -> RequestTimeline | None:
        """A request's timeline with its forks' (engine/timeline.py), read at a step boundary;
        None for an unknown id or a finished one no longer kept (``TimeoutError`` after
        ``timeout``)."""
        ...

    def loop_health(self) -> LoopHealth:
        """What the stall watchdog reads: cheap, from any thread."""
        ...

    def jobs(self) -> Sequence[PeriodicJob]:
        """The periodic jobs this implementation needs (memory trim, a fleet's converge)."""
        ...

    def replicas(self) -> ReplicaControl | None:
        """The fleet capability; None for one engine."""
        ...
