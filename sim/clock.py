"""The simulator's time: a clock that only moves when told (the engine reads it as its clock)."""

from __future__ import annotations


class VirtualClock:
    """Seconds of simulated time; ``LLMEngine`` and the policies call it like ``time.monotonic``.

    The cost-model runner advances it by each step's predicted time; the simulator jumps it to
    the next arrival when the engine is idle. It never goes back.
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"time cannot go back (advance by {dt})")
        self.now += dt

    def advance_to(self, t: float) -> None:
        """Move to ``t`` if it is later than now (an earlier ``t`` leaves the clock alone)."""
        if t > self.now:
            self.now = t
