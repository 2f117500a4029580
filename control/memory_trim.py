"""Memory given back after a load (issue 23, defect 6): a small job that, once the engine has
gone idle after work, asks the C allocator to return its free pages to the system.

Why: the answers of heavy requests (MBs of JSON with logprobs, the engine's per-step lists)
are made and freed on many threads (the event loop, the tokenizer's thread pool, the engine
thread), each with a glibc malloc arena of its own. Freed, that memory stays in the arenas:
glibc returns only the top of the main heap by itself, and its mmap threshold rises with each
large block freed, so later large blocks come from the arenas too. ``malloc_trim(0)`` walks
every arena and gives back each free page (``madvise``), so resident memory falls back near
its pre-load value. What stays is bounded and reused by the next load: the engine's decode
gather buffers (``DecodeGatherCache``, within its budget), the arrivals log (capped) and
pages still holding live objects.

The trim runs when the loop was idle on two ticks in a row after steps ran (so the last
answers were written), once per load; it takes milliseconds. Elsewhere than glibc it does
nothing. With ``--replicas`` it reads the control plane's own (idle) engine and so never runs:
the replicas' processes are Ray's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

from engine.async_engine import AsyncEngine

log = logging.getLogger(__name__)

JOB_ID = "memory_trim"
TICK_S = 5.0


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
    def __init__(self, engine: AsyncEngine, trim: Callable[[], bool] | None = MALLOC_TRIM) -> None:
        self._engine = engine
        self._trim = trim
        self._trimmed_step = engine.loop_health().step
        self._idle_step: int | None = None
        """The step count at the last idle tick (None after a busy one)."""
        self.trims = 0

    def tick(self) -> None:
        health = self._engine.loop_health()
        if health.busy:
            self._idle_step = None
            return
        idle_before, self._idle_step = self._idle_step, health.step
        if idle_before != health.step or health.step == self._trimmed_step:
            return  # idle only since this tick, or nothing ran since the last trim
        self._trimmed_step = health.step
        if self._trim is not None:
            self._trim()
            self.trims += 1
            log.debug("idle after step %d: free C heap pages given back", health.step)
