"""A cost model corrected by the engine's own steps.

A calibration fitted yesterday, or under other load, is off today by a factor (these machines'
speed swings about 2× from one day to the next). The engine's recent steps say by how much:
each step's shape (``StepShape``, taken as the runner is handed the batch) and its wall time
(the engine's ``StepRecord.wall_s``: schedule, forward, sampling, bookkeeping, what a cost
model's ``step_time`` prices). The correction is the ratio of their sums over a rolling window,
observed ÷ predicted for those same steps: time-weighted, so the long steps that make the
latencies weigh most, and clamped into ``CORRECTION_BOUNDS``. A prediction with it is the cost
model ``Scaled`` by the ratio (``sim.cost_model.Scaled``).

In the server, ``ObservingRunner`` wraps the engine's runner and notes each executed batch's
shape with its ordinal; ``StepObserver.recent`` pairs the newest of them with the engine's
step records of the same ordinals. It is the one correction the server has: the dry run's
figures and the guardrail's candidates are both scaled by it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.batch import ScheduledBatch, StepResult
from engine.runner import Runner
from engine.stats import EngineStats
from serving.engine import LLMEngine
from sim.cost_model import CostModel, StepShape

CORRECTION_BOUNDS = (0.2, 5.0)
"""Past these the cost model is not of this engine at all: the correction stops there."""
WINDOW_STEPS = 512
"""Steps the correction reads: the newest (at ~10-100 ms a step, the last seconds to a minute)."""


@dataclass(frozen=True, slots=True)
class ObservedStep:
    """One step the engine ran: its shape and how long it took."""

    shape: StepShape
    seconds: float


def step_ratio(model: CostModel, steps: Sequence[ObservedStep]) -> float | None:
    """Observed ÷ predicted over ``steps`` (Σ seconds ÷ Σ ``model.step_time``), clamped into
    ``CORRECTION_BOUNDS``; None without a step to compare."""
    observed = sum(s.seconds for s in steps)
    predicted = sum(model.step_time(s.shape) for s in steps)
    if not steps or predicted <= 0 or observed <= 0:
        return None
    return min(max(observed / predicted, CORRECTION_BOUNDS[0]), CORRECTION_BOUNDS[1])


class ObservingRunner:
    """The engine's runner, noting each batch it executes (its ``StepShape`` and the ordinal of
    the step among those that ran); every other attribute is the inner runner's."""

    def __init__(self, inner: Runner, window: int = WINDOW_STEPS) -> None:
        self.inner = inner
        self.executed = 0
        """Batches executed without raising: the engine records a step for each."""
        self.shapes: deque[tuple[int, StepShape]] = deque(maxlen=window)
        self._lock = threading.Lock()

    @property
    def last_forward_s(self) -> float:
        return self.inner.last_forward_s

    def __getattr__(self, name: str) -> Any:  # compute, device, release_buffers...
        return getattr(self.inner, name)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        shape = StepShape.of(batch)  # before the step moves the sequences on
        result = self.inner.execute(batch)
        with self._lock:
            self.executed += 1
            self.shapes.append((self.executed, shape))
        return result

    def noted(self) -> list[tuple[int, StepShape]]:
        with self._lock:
            return list(self.shapes)


class StepObserver:
    """The engine's recent steps as ``ObservedStep``s: the runner's shapes paired with the
    engine's step records by ordinal (the ``n``-th executed batch is the ``n``-th recorded
    step), a pair whose row counts disagree dropped. Read from any thread."""

    def __init__(self, runner: ObservingRunner, stats: EngineStats) -> None:
        self.runner = runner
        self.stats = stats

    def recent(self, limit: int = WINDOW_STEPS) -> list[ObservedStep]:
        shapes = dict(self.runner.noted())
        for _ in range(3):  # the engine may record a step while the records are copied
            total = self.stats.num_steps
            records = list(self.stats.steps)
            if self.stats.num_steps == total:
                break
        else:
            return []
        first = total - len(records) + 1
        steps = []
        for ordinal, record in enumerate(records, start=first):
            shape = shapes.get(ordinal)
            if shape is not None and shape.num_seqs == record.num_seqs:
                steps.append(ObservedStep(shape, record.wall_s))
        return steps[-limit:]


def observing(engine: LLMEngine) -> StepObserver:
    """Wrap ``engine``'s runner (an ``LLMEngine`` not yet started) in an ``ObservingRunner``;
    the observer of its steps."""
    runner = ObservingRunner(engine.runner)
    engine.runner = runner
    return StepObserver(runner, engine.stats)


StepSource = Callable[[], Sequence[ObservedStep]]
"""What a predictor reads the engine's recent steps from."""
