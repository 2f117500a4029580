"""Chat templates rendered where a render can be stopped: a small pool of spawned worker
processes, created when the model loads and closed at shutdown.

A template comes with the checkpoint and is untrusted code: jinja's sandbox keeps it from
Python's internals but not from looping 10^10 times, and a Python thread cannot be stopped.
So the server never runs a template itself. Each worker reads the checkpoint's template once
(``load_chat_template``, compiled once per worker) and renders conversations sent through its
pipe; the server side of each worker is one driver thread of this pool (not the thread pool
that tokenization uses), which waits on the pipe without holding the GIL. A render still
running after ``timeout_s`` is stopped by killing its worker, which the driver replaces before
it takes the next conversation; a render past ``max_output`` characters stops itself; a
worker that dies is replaced too. Each of these, and every failure of the template, is a
``ChatTemplateError`` naming its cause. A conversation that finds no worker free within
``timeout_s`` is refused with ``RendererBusy`` instead of waiting longer.

Each worker runs at a lower CPU priority (a hostile render takes what the engine leaves), its
memory is capped (``worker_memory_bytes``), and it exits when the server is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import resource
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from control.chat.template import ChatTemplateError, RenderFailure, load_chat_template

if TYPE_CHECKING:  # not in the worker, which needs only jinja
    from control.metrics import ControlMetrics

log = logging.getLogger(__name__)

WORKER_NICENESS = 5
"""Below the engine's priority, so a render that spins takes what the engine leaves; a normal
render takes a millisecond and hardly notices."""
WORKER_START_TIMEOUT_S = 60.0
"""How long a new worker may take to import jinja and say it is ready."""
RESTART_BACKOFF_S = 1.0
WORKER_BASE_MEMORY = 1 << 30
"""A worker's address space before its output (the interpreter, jinja, thread stacks)."""
PARENT_CHECK_S = 0.5


def worker_memory_bytes(max_output: int) -> int:
    """A worker's address-space cap: the interpreter, plus room for an output of
    ``max_output`` characters in its pieces, its join and its pickle (4 bytes a character)."""
    return WORKER_BASE_MEMORY + 16 * max_output


class RendererBusy(Exception):
    """Every worker stayed busy for ``timeout_s``: the conversation was not rendered."""


@dataclass(frozen=True, slots=True)
class RenderJob:
    """What the server sends a worker."""

    model_dir: str
    messages: list[dict[str, Any]]  # Any: the template's context, JSON (as tools below)
    add_generation_prompt: bool
    tools: list[dict[str, Any]] | None = None
    """The request's tools, for a template that renders them (``takes_tools``)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str


@dataclass(frozen=True, slots=True)
class RenderFailed:
    cause: RenderFailure
    message: str


@dataclass(frozen=True, slots=True)
class _Ready:
    """A worker's first message: imported and waiting for jobs."""


@dataclass(slots=True)
class _Queued:
    job: RenderJob
    future: Future[str]


class ChatRenderer:
    """``workers`` processes; ``submit`` / ``render`` a conversation, ``close`` at shutdown.
    With ``metrics``, the renders in flight and the failures by cause are counted there."""

    def __init__(
        self,
        workers: int,
        timeout_s: float,
        max_output: int,
        metrics: ControlMetrics | None = None,
        preload: Path | None = None,
    ) -> None:
        """``preload``: the checkpoint (or ``--tokenizer`` folder) whose template each worker
        reads and compiles as it starts, before it says it is ready, so that no render's time
        limit pays for reading it (a GGUF file's metadata takes seconds to parse)."""
        self.timeout_s = timeout_s
        self.max_output = max_output
        self.metrics = metrics
        self.preload = preload
        self._jobs: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._workers = [_Worker(i, self) for i in range(workers)]
        for worker in self._workers:
            worker.thread.start()

    def wait_ready(self, timeout: float = WORKER_START_TIMEOUT_S) -> bool:
        """Until every worker is started and ready (True; a stopped one's replacement too)
        or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        return all(w.ready.wait(max(0.0, deadline - time.monotonic())) for w in self._workers)

    def submit(
        self,
        model_dir: Path,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> Future[str]:
        """The rendered prompt, later; its exception is a ``ChatTemplateError``. A future
        still pending may be cancelled (no worker will take it)."""
        future: Future[str] = Future()
        if self._closed.is_set():
            future.set_exception(_shutting_down())
            return future
        job = RenderJob(str(model_dir), messages, add_generation_prompt, tools)
        self._jobs.put(_Queued(job, future))
        return future

    async def render(
        self,
        model_dir: Path,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """``submit`` awaited on the event loop: ``RendererBusy`` when no worker took the
        conversation within ``timeout_s``, then at most ``timeout_s`` more for the render."""
        future = self.submit(model_dir, messages, add_generation_prompt, tools)
        waiting = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({waiting}, timeout=self.timeout_s)
        except asyncio.CancelledError:  # the request is gone: no worker need take it
            waiting.cancel()
            raise
        if not done and future.cancel():
            raise RendererBusy(f"every chat template worker stayed busy for {self.timeout_s:g} s")
        return await waiting

    def close(self) -> None:
        """Stop every worker (a render in flight fails) and their drivers."""
        self._closed.set()
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.thread.join(timeout=2.0)
        while True:  # conversations no worker took
            try:
                queued = self._jobs.get_nowait()
            except queue.Empty:
                break
            if queued is not None and queued.future.set_running_or_notify_cancel():
                queued.future.set_exception(_shutting_down())


def _shutting_down() -> ChatTemplateError:
    return ChatTemplateError("the server is shutting down", "worker_died")


class _Worker:
    """One worker process and the driver thread that feeds it and enforces its deadline."""

    def __init__(self, index: int, pool: ChatRenderer) -> None:
        self.pool = pool
        self.ready = threading.Event()
        self.thread = threading.Thread(
            target=self._drive, name=f"servedeck-chat-render-{index}", daemon=True
        )
        self._lock = threading.Lock()  # the process and pipe, between the driver and close
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None

    def _drive(self) -> None:
        pool = self.pool
        while not pool._closed.is_set():
            if not self._alive() and not self._start():
                pool._closed.wait(RESTART_BACKOFF_S)
                continue
            queued = pool._jobs.get()
            if queued is None:
                break
            if not queued.future.set_running_or_notify_cancel():
                continue
            if not self._alive() and not self._start() and not pool._closed.is_set():
                queued.future.set_exception(  # it died while idle; its replacement did not start
                    ChatTemplateError("no chat template worker could be started", "worker_died")
                )
                continue
            if pool._closed.is_set():
                queued.future.set_exception(_shutting_down())
                continue
            try:
                queued.future.set_result(self._counted(queued.job))
            except ChatTemplateError as exc:
                queued.future.set_exception(exc)
        self.stop()

    def _alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _start(self) -> bool:
        """A new worker process, once it says it is ready; False when it did not start."""
        self.stop()
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        memory = worker_memory_bytes(self.pool.max_output)
        process = context.Process(
            target=serve_worker,
            args=(theirs, self.pool.max_output, memory, os.getpid(), self.pool.preload),
            name="servedeck-chat-render",
            daemon=True,
        )
        with self._lock:
            if self.pool._closed.is_set():
                return False
            try:
                process.start()
            except Exception:
                log.exception("a chat template worker could not be started")
                ours.close()
                theirs.close()
                return False
            self._process, self._conn = process, ours
        theirs.close()  # the worker's end: once it exits, ours reads EOF
        try:
            if ours.poll(WORKER_START_TIMEOUT_S) and isinstance(ours.recv(), _Ready):
                self.ready.set()
                return True
        except (EOFError, OSError):
            pass
        self.stop()
        if not self.pool._closed.is_set():
            log.error("a chat template worker did not start (exit code %s)", process.exitcode)
        return False

    def _counted(self, job: RenderJob) -> str:
        metrics = self.pool.metrics
        if metrics is None:
            return self._render(job)
        try:
            with metrics.chat_template_renders.track_inprogress():
                return self._render(job)
        except ChatTemplateError as exc:
            metrics.chat_template_failures.labels(exc.cause).inc()
            raise

    def _render(self, job: RenderJob) -> str:
        conn, process, timeout_s = self._conn, self._process, self.pool.timeout_s
        assert conn is not None and process is not None
        try:
            conn.send(job)
            if not conn.poll(timeout_s):
                self.stop()
                raise ChatTemplateError(
                    f"the chat_template took longer than chat_template_timeout_s "
                    f"({timeout_s:g} s) to render and was stopped",
                    "timeout",
                )
            reply = conn.recv()
        except (EOFError, OSError):
            self.stop()
            if self.pool._closed.is_set():
                raise _shutting_down() from None
            raise ChatTemplateError(
                f"the chat_template's worker process died while rendering (exit code "
                f"{process.exitcode})",
                "worker_died",
            ) from None
        if isinstance(reply, RenderFailed):
            raise ChatTemplateError(reply.message, reply.cause)
        assert isinstance(reply, Rendered)
        return reply.text

    def stop(self) -> None:
        """Kill the process (if any) and close the pipe; the driver starts a new one."""
        with self._lock:
            process, conn = self._process, self._conn
            self._process = self._conn = None
            self.ready.clear()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(timeout=5.0)
        if conn is not None:
            conn.close()


# The worker's side: what runs in the spawned process.


def serve_worker(
    conn: Connection,
    max_output: int,
    memory_bytes: int,
    parent_pid: int,
    preload: Path | None = None,
) -> None:
    """Render each job from ``conn`` until the server closes its end; ``preload``'s template
    is read and compiled first (a failure there is reported by the first render of it)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    os.nice(WORKER_NICENESS)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    if preload is not None:
        with contextlib.suppress(Exception):
            load_chat_template(Path(preload))  # the key a render asks for
    conn.send(_Ready())
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(render_job(job, max_output))


def render_job(job: RenderJob, max_output: int) -> Rendered | RenderFailed:
    """One conversation through the checkpoint's template (read and compiled once)."""
    try:
        template = load_chat_template(Path(job.model_dir))
        if template is None:
            return RenderFailed("missing", f"{Path(job.model_dir).name} has no chat_template")
        text = template.render(job.messages, job.add_generation_prompt, max_output, job.tools)
        return Rendered(text)
    except ChatTemplateError as exc:
        return RenderFailed(exc.cause, str(exc))
    except Exception as exc:  # reading the checkpoint's files
        return RenderFailed("failed", f"the chat_template failed: {type(exc).__name__}: {exc}")


def _exit_with_parent(parent_pid: int) -> None:
    """A render that never ends would outlive a server killed with SIGKILL: not this one."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)
