"""The engine's runner with the forward swapped for a cost model: it predicts how long the step
takes, advances the virtual clock by that, and returns placeholder tokens.

Requests in a simulation ask for ``ignore_eos`` and ``max_tokens`` = the trace's output length,
so the placeholder token's value never matters: every request stops by length.
"""

from __future__ import annotations

from engine.batch import ScheduledBatch, StepResult
from sim.clock import VirtualClock
from sim.cost_model import CostModel, StepShape

PLACEHOLDER_TOKEN = 0


class CostModelRunner:
    """``execute(batch) -> StepResult`` and ``last_forward_s``, as ``engine.runner.Runner``.

    ``last_forward_s`` is the predicted step time (the simulated machine's forward, sampling
    and overhead together); ``busy_s`` sums it over the run.
    """

    def __init__(self, cost_model: CostModel, clock: VirtualClock) -> None:
        self.cost_model = cost_model
        self.clock = clock
        self.last_forward_s = 0.0
        self.busy_s = 0.0

    def execute(self, batch: ScheduledBatch) -> StepResult:
        dt = self.cost_model.step_time(StepShape.of(batch))
        self.clock.advance(dt)
        self.last_forward_s = dt
        self.busy_s += dt
        return StepResult([PLACEHOLDER_TOKEN] * sum(1 for e in batch.entries if e.sample))
