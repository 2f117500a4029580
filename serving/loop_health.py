"""What the stall watchdog reads of an engine loop (``AsyncEngine.loop_health``)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.batch import StepInfo


@dataclass(frozen=True, slots=True)
class LoopHealth:
    """A snapshot of the engine loop for the stall watchdog.

    ``seconds_since_progress`` counts from the last time the loop came round (a step or a
    command finished, or an idle wait ended); it grows without bound only while a step or a
    command hangs. ``step`` is the number of steps run so far; ``current_step`` describes the
    batch in flight (None between steps, e.g. while a command runs)."""

    alive: bool
    busy: bool
    seconds_since_progress: float
    step: int
    current_step: StepInfo | None

    def describe(self) -> str:
        if self.current_step is not None:
            return self.current_step.describe()
        return f"between steps (after step {self.step})"
