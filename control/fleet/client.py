"""The deployment handle: how the fleet queues a request (imports ray).

``FleetEngine`` is how ``Fleet`` (the fleet's ``EngineService``) queues requests: the routes
call ``add_requests`` and read an async stream of ``RequestOutput`` per prompt. Admission is
checked here first (by the control plane's tokenizer-only front of the same config: tokenizer,
limits), so a refusal is still a 400 before any stream starts; a batch's prompts are then
admitted by their replicas together (``BatchAdmission``). Each stream asks every replica for
its cached prefix of the prompt (when prefix caching is on), then calls ``generate`` through
the handle, whose ``FleetRouter`` picks the replica. A replica that dies mid-request ends the
stream with ``EngineStopped`` naming it, never a hang; the others keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ray import exceptions as ray_exceptions
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from control.core.config import Settings
from control.fleet.affinity import prefix_hashes
from control.fleet.registry import router_of
from control.fleet.router import TARGET, ReplicaGone
from control.fleet.score import RouteHint
from engine.errors import EngineStepError, EngineStopped, QueueFull, RequestRejected
from engine.front import EngineFront, QueuedPrompt, request_ids
from engine.outputs import RequestOutput

if TYPE_CHECKING:
    from control.fleet.replica import EngineReplica

log = logging.getLogger(__name__)

CUT_OFF_POLL_S = 0.5
"""How often a stream waiting for its next output looks for its replica's drain deadline."""
CUT_OFF_KEPT_S = 600.0
"""How long a passed drain deadline is kept (a replica's id is never reused)."""
Generated = DeploymentResponseGenerator[str | RequestOutput]
"""A ``generate`` call's stream: the replica's id (its acknowledgement), then the outputs."""
PASSED_THROUGH = (RequestRejected, QueueFull, EngineStepError, EngineStopped)
"""Errors a replica raises that reach the routes as themselves."""


class FleetEngine:
    def __init__(
        self,
        handle: DeploymentHandle[EngineReplica],
        deployment: str,
        front: EngineFront,
        on_finished: Callable[[RequestOutput], None] | None = None,
        probe_timeout_s: float = Settings.model_fields["prefix_probe_timeout_s"].default,
    ) -> None:
        self.handle = handle
        self.probe_timeout_s = probe_timeout_s
        """How long routing waits for the replicas' prefix-cache answers (the router's memory
        stands in for a replica that has not answered by then; 0: no probe)."""
        self.deployment = deployment
        self.front = front
        self.on_finished = on_finished
        self.lost_note: str | None = None
        """What a request whose replica went away is told, while a restart explains it."""
        self._cut_offs: dict[str, tuple[float, str]] = {}
        """Replica -> (monotonic deadline, why): a drain's end, when its streams are cut."""
        self._stopped: str | None = None
        """Set by ``cut_off_all`` or ``close``: why a new request is refused."""

    def add_requests(self, batch: Sequence[QueuedPrompt]) -> list[FleetStream]:
        """One stream per prompt, admitted together (``BatchAdmission``); every prompt is
        checked here first, so a refusal is still a 400 for the whole batch."""
        if self._stopped is not None:
            raise EngineStopped(self._stopped)
        self.front.check_batch(batch)  # RequestRejected now, as a 400
        request_ids(batch)
        streams = [FleetStream(self, q) for q in batch]
        BatchAdmission(streams)
        return streams

    @property
    def is_running(self) -> bool:
        return self._stopped is None

    def close(self) -> None:
        self._stopped = self._stopped or "the control plane is shutting down"

    def cut_off(self, replica: str, deadline: float, note: str) -> None:
        """End the streams still on ``replica`` at ``deadline`` (``time.monotonic``) with
        ``EngineStopped(note)``: a drain's timeout, enforced here whatever Ray's controller,
        which should end the replica then, does on a loaded machine. Called from the restart
        thread; the streams read it on the event loop (one dict item set at a time)."""
        now = time.monotonic()
        for old, (at, _) in list(self._cut_offs.items()):
            if at < now - CUT_OFF_KEPT_S:
                self._cut_offs.pop(old, None)
        self._cut_offs[replica] = (deadline, note)

    def cut_off_all(self, reason: str) -> int:
        """The server's drain deadline: every replica's streams end now with
        ``EngineStopped(reason)`` (within ``CUT_OFF_POLL_S``), as a restart's do. Answers how
        many requests the router had in flight."""
        self._stopped = reason
        router = router_of(self.deployment)
        in_flight = sum(router.in_flight().values()) if router is not None else 0
        now = time.monotonic()
        for rid in self.replica_ids():
            self.cut_off(rid, now, reason)
        return in_flight

    def cut_off_of(self, replica: str | None) -> tuple[float, str] | None:
        return self._cut_offs.get(replica) if replica is not None else None

    # -- fan-out to the replicas ---------------------------------------------------------

    def replica_ids(self) -> list[str]:
        router = router_of(self.deployment)
        return router.replica_ids() if router is not None else []

    # Any: each replica method's own result (or the exception it ended with); the caller knows
    # which method it asked for
    def call_each(self, method: str, *args: object, timeout: float) -> dict[str, Any]:
        """``method`` on every live replica (from a thread, not the event loop): each one's
        result, or the exception it ended with (``TimeoutError`` after ``timeout``).

        A replica that left between the listing and its call (drained by a rolling restart,
        or replaced) is left out, and the replicas listed after it are asked too: the list
        can change under a fan-out, and the one that took its place is live."""
        deadline = time.monotonic() + timeout
        results: dict[str, Any] = {}
        asked: set[str] = set()
        for _ in range(2):
            ids = [rid for rid in self.replica_ids() if rid not in asked]
            asked.update(ids)
            calls = {
                rid: self.handle.options(method_name=method).remote(*args, **{TARGET: rid})
                for rid in ids
            }
            gone = False
            for rid, response in calls.items():
                try:
                    timeout_s = max(0.01, deadline - time.monotonic())
                    results[rid] = response.result(timeout_s=timeout_s)
                except Exception as exc:
                    if _is_gone(exc):
                        gone = True
                        continue
                    results[rid] = _as_timeout(exc)
                    # cancel() raises the error of a call that failed, even one failing just
                    # after the timeout (and Ray leaves it unannotated)
                    with contextlib.suppress(Exception):
                        response.cancel()  # type: ignore[no-untyped-call]
            if not gone:
                break
        return results

    async def probe_prefix(self, token_ids: list[int]) -> RouteHint | None:
        """Each replica's cached blocks of this prompt, from those that answered within
        ``probe_timeout_s`` (the router's memory stands in for the others)."""
        if not self.front.config.enable_prefix_caching:
            return None
        blocks = prefix_hashes(token_ids, self.front.limits.block_size)
        if not blocks:
            return None
        probe = self.handle.options(method_name="match_prefix")
        calls = {
            asyncio.ensure_future(probe.remote(token_ids, **{TARGET: rid})): rid
            for rid in (self.replica_ids() if self.probe_timeout_s > 0 else [])
        }
        hits: dict[str, int] = {}
        if calls:
            done, late = await asyncio.wait(calls, timeout=self.probe_timeout_s)
            for call in late:
                call.cancel()
            for call in done:
                if not call.cancelled() and call.exception() is None:
                    hits[calls[call]] = call.result()
        return RouteHint(prompt_blocks=len(blocks), hits=hits, blocks=blocks)


class BatchAdmission:
    """A batch's streams are admitted together: the first ``admitted()`` of any of them routes
    every prompt at once (each on its own: a batch may spread over the replicas) and waits for
    every replica's acknowledgement. One refusal (a replica's full queue) closes the others,
    whose replicas abort what they took, and every stream's ``admitted()`` raises it: the
    batch is refused whole, as one engine refuses it."""

    def __init__(self, streams: list[FleetStream]) -> None:
        self.streams = streams
        for stream in streams:
            stream.admission = self
        self._admitting: asyncio.Future[None] | None = None

    async def admitted(self) -> None:
        if self._admitting is None:
            self._admitting = asyncio.ensure_future(self._admit())
        await self._admitting

    async def _admit(self) -> None:
        results = await asyncio.gather(
            *(stream.start() for stream in self.streams), return_exceptions=True
        )
        refusal = next((r for r in results if isinstance(r, BaseException)), None)
        if refusal is not None:
            for stream in self.streams:
                await stream.aclose()
            raise refusal


class FleetStream:
    """One request's outputs from whichever replica the router chose."""

    def __init__(self, fleet: FleetEngine, prompt: QueuedPrompt) -> None:
        self.fleet = fleet
        self.request_id = prompt.request_id
        self.admission = BatchAdmission([self])
        """Its batch's (a batch of one until ``BatchAdmission`` joins it to the others)."""
        self._args = (
            list(prompt.token_ids),
            prompt.params,
            prompt.request_id,
            prompt.priority,
            prompt.tenant,
        )
        self._gen: Generated | None = None
        self._done = False
        self.replica: str | None = None
        """The replica serving it (its acknowledgement says)."""

    def __aiter__(self) -> FleetStream:
        return self

    async def admitted(self) -> None:
        """The batch's admission (``BatchAdmission``): ``QueueFull`` or ``RequestRejected``
        raise here, so a route that awaits this before answering refuses with an HTTP error,
        not with an error event."""
        await self.admission.admitted()

    async def start(self) -> None:
        """Route the request and wait until its replica's engine admitted it (the replica's
        first item)."""
        if self._gen is not None or self._done:
            return
        try:
            hint = await self.fleet.probe_prefix(self._args[0])
            handle = self.fleet.handle.options(stream=True, method_name="generate")
            self._gen = cast(Generated, handle.remote(*self._args, route=hint))  # stream=True
            self.replica = cast(str, await self._gen.__anext__())  # the acknowledgement
        except Exception as exc:
            self._done = True
            raise _public(exc, self.fleet.lost_note) from None

    async def __anext__(self) -> RequestOutput:
        if not self._done:
            await self.admitted()
        if self._done or self._gen is None:
            raise StopAsyncIteration
        try:
            output = await self._next_output(self._gen)
        except StopAsyncIteration:
            self._done = True
            raise
        except Exception as exc:
            self._done = True
            with contextlib.suppress(Exception):
                # a cut-off stream: the replica aborts the request (Ray's cancel: unannotated)
                self._gen.cancel()  # type: ignore[no-untyped-call]
            raise _public(exc, self.fleet.lost_note) from None
        if output.finished and self.fleet.on_finished is not None:
            try:
                self.fleet.on_finished(output)
            except Exception:
                log.exception("on_finished hook failed")
        return output

    async def _next_output(self, gen: Generated) -> RequestOutput:
        """The replica's next output, or ``EngineStopped`` once its replica's drain deadline
        (``FleetEngine.cut_off``) has passed."""
        step = asyncio.ensure_future(gen.__anext__())
        try:
            while True:
                cut = self.fleet.cut_off_of(self.replica)
                wait = CUT_OFF_POLL_S if cut is None else cut[0] - time.monotonic()
                done, _ = await asyncio.wait({step}, timeout=max(0.0, min(wait, CUT_OFF_POLL_S)))
                if done:
                    return cast(RequestOutput, step.result())  # after the acknowledgement
                if cut is not None and time.monotonic() >= cut[0]:
                    raise EngineStopped(cut[1])
        finally:
            if not step.done():
                step.cancel()

    async def aclose(self) -> None:
        if not self._done and self._gen is not None:
            # the replica's generator is cancelled: it aborts the request (Ray's cancel:
            # unannotated)
            self._gen.cancel()  # type: ignore[no-untyped-call]
        self._done = True


def _public(exc: BaseException, lost_note: str | None = None) -> BaseException:
    """What the routes see of a replica's failure: our own errors as raised there, a dead
    replica as ``EngineStopped`` (``lost_note`` says why, during a restart), anything else as
    ``EngineStepError`` naming its type."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, PASSED_THROUGH):
        return cause
    if isinstance(exc, PASSED_THROUGH):
        return exc
    if isinstance(exc, (ray_exceptions.RayActorError, ray_exceptions.ActorUnavailableError)):
        return EngineStopped(
            lost_note or "the replica serving this request died; retry the request"
        )
    return EngineStepError(f"the replica failed: {type(cause or exc).__name__}")


def _is_gone(exc: BaseException) -> bool:
    return isinstance(exc, ReplicaGone) or isinstance(getattr(exc, "cause", None), ReplicaGone)


def _as_timeout(exc: Exception) -> Exception:
    if isinstance(exc, (TimeoutError, ray_exceptions.GetTimeoutError)):
        return TimeoutError("the replica has not answered yet")
    return exc
