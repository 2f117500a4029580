"""Memory given back after a load (issue 23, defect 6): a small job that, once the engine has
gone idle after work, frees the engine's step buffers and asks the C allocator to return its
free pages to the system.

What held it: the torch attention backend's decode gather buffers (``DecodeGatherCache``: each
decode row's K/V copied out of the pool, per layer, kept across steps), whose budget is twice
the KV pool. A load of many long decode rows (``n`` choices of a long prompt) grows them to
hundreds of MB, and they were kept after the last request ended, for good. They are freed now
(``LLMEngine.release_buffers``, a command run at the step boundary; the next decode step
lays them out afresh, as its first step after an idle spell did anyway). Then
``malloc_trim(0)`` gives back the free pages of every glibc arena: heavy answers (MBs of JSON
with logprobs) are made and freed on many threads, and glibc keeps what they freed.

What stays is bounded: the KV pool (allocated whole at start), the arrivals log (capped),
pages still holding live objects. The trim runs when the loop was idle on two ticks in a row
after steps ran (so the last answers were written), once per load; it takes milliseconds.
Without glibc only the buffers are freed. It is a job of the local engine (``LocalEngine.jobs``):
a fleet's control plane runs no engine, and each replica is a process of Ray's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from concurrent.futures import Future

from serving.loop_health import LoopHealth

log = logging.getLogger(__name__)

JOB_ID = "memory_trim"
TICK_S = 5.0
RELEASE_TIMEOUT_S = 5.0


def glibc_malloc_trim() -> Callable[[], bool] | None:
    """``malloc_trim(0)`` of this process's C library, or None where there is none (not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: bool(trim(0))


MALLOC_TRIM = glibc_malloc_trim()


class MemoryTrim:
    def __init__(
        self,
        loop_health: Callable[[], LoopHealth],
        release_buffers: Callable[[], Future[None]],
        trim: Callable[[], bool] | None = MALLOC_TRIM,
    ) -> None:
        self._loop_health = loop_health
        self._release_buffers = release_buffers
        self._trim = trim
        self._trimmed_step = loop_health().step
        self._idle_step: int | None = None
        """The step count at the last idle tick (None after a busy one)."""
        self.trims = 0

    def tick(self) -> None:
        health = self._loop_health()
        if health.busy:
            self._idle_step = None
            return
        idle_before, self._idle_step = self._idle_step, health.step
        if idle_before != health.step or health.step == self._trimmed_step:
            return  # idle only since this tick, or nothing ran since the last trim
        self._trimmed_step = health.step
        try:  # on the engine thread, at once: it is idle
            self._release_buffers().result(RELEASE_TIMEOUT_S)
        except TimeoutError:
            return  # a step began meanwhile: the next idle spell trims
        if self._trim is not None:
            self._trim()
        self.trims += 1
        log.debug("idle after step %d: buffers freed, free C heap pages given back", health.step)
