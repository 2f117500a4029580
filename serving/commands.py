"""The engine's cross-thread command queue.

``LLMEngine`` is driven by exactly one thread, its owner. Any other thread may post a command
(a policy switch, a memory-reserve change, a reclaim sweep, an abort, a snapshot): it waits in
this queue until the owner reaches the next step boundary, runs there, and its result (or
exception) is handed back through a ``Future``. On the owner thread between steps a command
runs at once, so offline use needs no loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class CommandQueue:
    def __init__(self, wakeup: threading.Event, at_boundary: Callable[[], None]) -> None:
        """``wakeup`` is set when a command is posted (the loop may be asleep);
        ``at_boundary`` runs before any command does (the engine takes in new requests, so a
        command sees every request added before it was posted)."""
        self._wakeup = wakeup
        self._at_boundary = at_boundary
        # Each posted command bound to its future: running it settles the future.
        self._pending: deque[Callable[[], None]] = deque()
        self._owner = threading.get_ident()
        self._in_step = False

    def bind_to_current_thread(self) -> None:
        """Make the calling thread the one that steps the engine (the server's loop)."""
        self._owner = threading.get_ident()

    def submit(self, command: Callable[[], T]) -> Future[T]:
        """Run ``command`` at the next step boundary (now, on the owner between steps)."""
        future: Future[T] = Future()
        if threading.get_ident() == self._owner and not self._in_step:
            self._at_boundary()
            _run(command, future)
        else:
            self._pending.append(lambda: _run(command, future))
            self._wakeup.set()
        return future

    def call(self, command: Callable[[], T], timeout: float | None = 30.0) -> T:
        """``submit`` and wait for the answer."""
        return self.submit(command).result(timeout)

    def has_pending(self) -> bool:
        return bool(self._pending)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """The owner is inside a step: commands from now on wait for its end. Entering runs
        the commands posted so far (the step boundary)."""
        self._in_step = True
        try:
            self._wakeup.clear()
            self._at_boundary()
            while self._pending:
                self._pending.popleft()()
            yield
        finally:
            self._in_step = False


def _run(command: Callable[[], T], future: Future[T]) -> None:
    try:
        future.set_result(command())
    except Exception as exc:  # delivered to whoever waits on the future
        future.set_exception(exc)
