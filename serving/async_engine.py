"""The server's engine: one background thread owns ``LLMEngine`` and steps it; request
handlers on asyncio event loops read their outputs as async iterators.

The thread steps while there is work (requests or commands) and otherwise sleeps on
``engine.wakeup``, which ``add_requests`` and every command set. Each step's outputs are handed
to the waiting streams with ``loop.call_soon_threadsafe``. A stream whose consumer goes away
(cancelled while waiting, or closed before the end) aborts its request, which frees its KV
blocks at the next step boundary. A request whose own row failed (``finish_reason="error"``)
gets ``RequestFailed`` on its stream alone; an exception from ``step()`` (a failing forward)
fails every open stream and is logged; the loop keeps serving either way.

``loop_health()`` is the stall watchdog's view of the loop: whether it has work and how long
since it last came round, with the step in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from engine.errors import EngineStepError, EngineStopped, RequestFailed, RequestRejected
from engine.front import Prompt, QueuedPrompt, request_ids
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from serving import faults
from serving.engine import LLMEngine
from serving.loop_health import LoopHealth

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
"""How long the idle loop sleeps before re-checking (a wake-up cuts it short)."""
ERROR_BACKOFF_S = 0.1


class RequestStream:
    """Outputs of one request, in order; the last one has ``request_finished`` set (with
    ``n`` > 1 the outputs of its sequences interleave, each naming its ``index``)."""

    def __init__(self, request_id: str, owner: AsyncEngine, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self._owner = owner
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def admitted(self) -> None:
        """At once: ``add_requests`` admitted it (its refusals raised there)."""

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:  # cancelled: nobody will read the rest
            self._abandon()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.request_finished:
            self._done = True
        return item

    @property
    def finished(self) -> bool:
        return self._done

    async def aclose(self) -> None:
        """Stop reading; an unfinished request is aborted."""
        self._abandon()

    def _abandon(self) -> None:
        if not self._done:
            self._done = True
            self._owner._abort(self.request_id)

    # called on the stream's event loop
    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine,
        on_finished: Callable[[RequestOutput], None] | None = None,
        idle_wait_s: float = IDLE_WAIT_S,
    ) -> None:
        self.engine = engine
        self._on_finished = on_finished
        self._idle_wait_s = idle_wait_s
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._cut_off: str | None = None
        """Set by ``cut_off``: why a new request is refused while the server shuts down."""
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="servedeck-engine", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop stepping (after the current step) and fail every open stream."""
        self._stopping.set()
        self.engine.wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._fail_all(EngineStopped("the engine shut down before the request finished"))

    def cut_off(self, reason: str) -> int:
        """A drain's deadline: end every open stream now with ``EngineStopped(reason)`` (the
        routes answer an error event and ``[DONE]``, or a 503) and abort its request at the
        next step boundary; later requests are refused the same way. Safe from any thread,
        also while a step hangs; the loop keeps running until ``shutdown``. Answers how many
        requests were cut off."""
        self._cut_off = reason
        return self._fail_all(EngineStopped(reason), abort=True)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def loop_health(self) -> LoopHealth:
        """Cheap and lock-free: safe to call from any thread at any time."""
        engine = self.engine
        return LoopHealth(
            alive=self.is_running,
            busy=engine.has_unfinished_requests() or engine.commands.has_pending(),
            seconds_since_progress=time.monotonic() - self._last_progress,
            step=engine.stats.num_steps,
            current_step=engine.current_step,
        )

    # -- requests --------------------------------------------------------------------------

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> RequestStream:
        """Queue a request and return its stream: the batch of one (``add_requests``)."""
        token_ids = self.engine.front.tokenize(prompt)
        queued = QueuedPrompt(token_ids, params or SamplingParams(), request_id or uuid.uuid4().hex)
        return self.add_requests([queued])[0]

    def add_requests(self, batch: Sequence[QueuedPrompt]) -> list[RequestStream]:
        """Queue a batch whole or not at all (``LLMEngine.add_requests``: ``RequestRejected``
        / ``QueueFull`` at once) and return one stream per prompt, in order. Every stream is
        registered before the engine can produce an output, and all are dropped again on a
        refusal. Call from a running event loop: outputs are delivered to that loop."""
        if not self.is_running:
            raise EngineStopped("the engine is not running")
        if self._cut_off is not None:
            raise EngineStopped(self._cut_off)
        loop = asyncio.get_running_loop()
        streams = [RequestStream(rid, self, loop) for rid in request_ids(batch)]
        with self._lock:
            taken = next((s.request_id for s in streams if s.request_id in self._streams), None)
            if taken is not None:
                _close(streams)
                raise RequestRejected(f"request id {taken!r} is already in use", "request_id")
            for stream in streams:  # before the engine can produce their outputs
                self._streams[stream.request_id] = stream
        try:
            self.engine.add_requests(batch)
        except BaseException:
            with self._lock:
                for stream in streams:
                    self._streams.pop(stream.request_id, None)
            _close(streams)
            raise
        return streams

    def leak(self, request_id: str, timeout: float = 30.0) -> bool:
        """Test only (serving.faults): drop a request but keep its blocks (what the reclaim
        sweep must fix). Its stream ends with an error since no more outputs will come."""
        leaked = faults.leak_sequence(self.engine, request_id).result(timeout)
        self._fail(request_id, EngineStepError("the request was dropped by the test-only leak"))
        return leaked

    def stall(self, seconds: float) -> Future[float]:
        """Test only (serving.faults): the next step with requests in flight blocks the loop
        for ``seconds``. Resolves once the stall is over."""
        return faults.stall(self.engine, seconds)

    def _abort(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)
        try:
            self.engine.abort(request_id)
        except Exception:  # only from a shut-down engine; nothing left to free
            log.debug("abort of %s failed", request_id, exc_info=True)

    # -- the loop (engine thread) ----------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        engine.commands.bind_to_current_thread()
        while not self._stopping.is_set():
            self._last_progress = time.monotonic()
            if not (engine.has_unfinished_requests() or engine.commands.has_pending()):
                self._sleep(self._idle_wait_s)
                continue
            steps_before = engine.stats.num_steps
            try:
                outputs = engine.step()
                self._dispatch(outputs)
            except Exception as exc:
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all(EngineStepError(f"engine step failed: {exc!r}"), abort=True)
                self._sleep(ERROR_BACKOFF_S)
                continue
            if not outputs and engine.stats.num_steps == steps_before:
                # Nothing could be scheduled (waiting for a change): sleep until one comes.
                self._sleep(self._idle_wait_s)

    def _sleep(self, timeout: float) -> None:
        # Clear after waking, then re-check the work: a wake-up set after the check is kept.
        if self.engine.wakeup.wait(timeout):
            self.engine.wakeup.clear()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        deliveries: dict[asyncio.AbstractEventLoop, list[Delivery]] = defaultdict(list)
        failed_requests: list[str] = []
        with self._lock:
            for output in outputs:
                failure_ends = output.finish_reason == "error"
                if output.request_finished or failure_ends:
                    stream = self._streams.pop(output.request_id, None)
                else:
                    stream = self._streams.get(output.request_id)
                if stream is None:
                    continue
                if failure_ends:
                    log.warning("request %s failed: %s", output.request_id, output.error)
                    failure = RequestFailed(output.request_id, output.error or "request failed")
                    deliveries[stream._loop].append((stream, failure))
                    if not output.request_finished:  # its other sequences are not wanted now
                        failed_requests.append(output.request_id)
                else:
                    deliveries[stream._loop].append((stream, output))
        for request_id in failed_requests:
            self.engine.abort(request_id)
        for output in outputs:
            if output.finished and self._on_finished is not None:
                try:
                    self._on_finished(output)
                except Exception:
                    log.exception("on_finished hook failed")
        for loop, items in deliveries.items():
            _deliver_to(loop, items)

    def _fail(self, request_id: str, error: BaseException) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            _deliver_to(stream._loop, [(stream, error)])

    def _fail_all(self, error: BaseException, abort: bool = False) -> int:
        """End every open stream with ``error`` (``abort``: and its request); how many."""
        with self._lock:
            streams, self._streams = self._streams, {}
        deliveries: dict[asyncio.AbstractEventLoop, list[Delivery]] = defaultdict(list)
        for request_id, stream in streams.items():
            deliveries[stream._loop].append((stream, error))
            if abort:  # runs now between steps on the engine thread, else at the next boundary
                try:
                    self.engine.abort(request_id)
                except Exception:
                    log.exception("could not abort %s", request_id)
        for loop, items in deliveries.items():
            _deliver_to(loop, items)
        return len(streams)


def _close(streams: list[RequestStream]) -> None:
    """Streams of a refused batch: ended, nothing to abort (none was queued)."""
    for stream in streams:
        stream._done = True


Delivery = tuple[RequestStream, RequestOutput | BaseException]
"""An output, or the error that ends the stream, for one stream."""


def _deliver_to(loop: asyncio.AbstractEventLoop, items: list[Delivery]) -> None:
    def deliver() -> None:
        for stream, item in items:
            stream._put(item)

    with contextlib.suppress(RuntimeError):  # the consumer's loop is closed: nobody listens
        loop.call_soon_threadsafe(deliver)
