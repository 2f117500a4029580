"""The cost model corrected by the engine's own steps (``sim.correction``): the ratio of the
observed step times to the model's prediction for those same steps, and the pairing of the
runner's shapes with the engine's step records."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from control.guardrail.prediction_worker import summarise
from engine.runner import Runner
from sim.correction import (
    CORRECTION_BOUNDS,
    WINDOW_STEPS,
    ObservedStep,
    ObservingRunner,
    StepObserver,
    step_ratio,
)
from sim.cost_model import CostModel, Scaled, StepShape
from sim.simulator import SimSetup, simulate
from sim.trace import Uniform, poisson_trace


@dataclass
class Linear(CostModel):
    """A step: a constant, a cost per token computed, per context token read, per sequence."""

    name: str
    constant: float
    per_token: float
    per_context: float
    per_seq: float

    def step_time(self, shape: StepShape) -> float:
        context = sum(shape.decode_context) + sum(
            t * c for t, c in zip(shape.prefill_tokens, shape.prefill_context, strict=True)
        )
        return (
            self.constant
            + self.per_token * shape.num_tokens
            + self.per_context * context
            + self.per_seq * shape.num_seqs
        )

    def kv_cache_blocks(self, block_size: int) -> int | None:
        return 2048


TRUE = Linear("today", 4e-3, 2e-4, 2e-6, 1e-4)
FAST = Linear("yesterday", 2.1e-3, 0.95e-4, 1.0e-6, 0.5e-4)
"""Calibrated on a day this machine ran twice as fast: every cost about half (within 5 %)."""
TRACE = poisson_trace(6.0, 160, Uniform(32, 400), Uniform(8, 64), seed=3)
SETUP = SimSetup(max_num_seqs=32, max_num_batched_tokens=512)


def run(model: CostModel, observe: bool = False) -> tuple[dict[str, float], list[ObservedStep]]:
    runners: list[ObservingRunner] = []

    def wrap(inner: Runner) -> Runner:
        runners.append(ObservingRunner(inner, window=100_000))
        return runners[-1]

    result = simulate(TRACE, model, "continuous", SETUP, wrap if observe else None)
    figures = summarise(result.records)
    # in a simulation a step takes what the cost model says: here, "today's" machine
    steps = [ObservedStep(s, model.step_time(s)) for _, s in runners[0].noted()] if observe else []
    return {
        "tok/s": figures.output_tokens_per_s,
        "ttft p50": figures.ttft_p50_s or 0.0,
        "ttft p99": figures.ttft_p99_s or 0.0,
        "tpot p50": figures.tpot_p50_s or 0.0,
    }, steps


def test_a_model_off_by_two_predicts_within_a_few_percent_once_corrected() -> None:
    """Output tok/s, TTFT p50 and TPOT p50 within 5 % (TTFT p99 within 10 %) of the run the
    steps came from, where the stale model alone misses every latency by more than 40 %."""
    measured, steps = run(TRUE, observe=True)  # the engine's run: what it did, step by step
    assert len(steps) > WINDOW_STEPS
    ratio = step_ratio(FAST, steps[-WINDOW_STEPS:])  # its newest steps, the rolling window
    assert ratio is not None and 1.8 < ratio < 2.4
    stale, _ = run(FAST)
    corrected, _ = run(Scaled(FAST, ratio))
    for name, value in measured.items():
        if name != "tok/s":  # arrival-bound: the same for any fast enough engine
            assert stale[name] < 0.6 * value, (name, stale[name], value)  # off, uncorrected
        within = 0.10 if name == "ttft p99" else 0.05  # a tail amplifies what one scale leaves
        assert corrected[name] == pytest.approx(value, rel=within), (name, corrected[name], value)


def test_the_ratio_is_time_weighted_and_clamped() -> None:
    short, long = StepShape(decode_context=(10,)), StepShape((400,), (0,), ())
    unit = Linear("unit", 0.0, 1e-3, 0.0, 0.0)
    steps = [ObservedStep(short, 2e-3), ObservedStep(long, 0.8)]  # 2x and 2x
    assert step_ratio(unit, steps) == pytest.approx(2.0)
    skewed = [ObservedStep(short, 1e-3 * 3), ObservedStep(long, 0.4)]  # 3x short, 1x long
    assert step_ratio(unit, skewed) == pytest.approx(0.403 / 0.401)
    assert step_ratio(unit, [ObservedStep(long, 100.0)]) == CORRECTION_BOUNDS[1]
    assert step_ratio(unit, [ObservedStep(long, 1e-6)]) == CORRECTION_BOUNDS[0]
    assert step_ratio(unit, []) is None


def test_the_observer_pairs_each_shape_with_its_step_record() -> None:
    runners: list[ObservingRunner] = []

    def wrap(inner: Runner) -> Runner:
        runners.append(ObservingRunner(inner, window=64))
        return runners[-1]

    result = simulate(TRACE[:40], TRUE, "continuous", SETUP, wrap)
    runner = runners[0]
    assert runner.executed == result.stats.num_steps
    assert runner.last_forward_s == runner.inner.last_forward_s
    observer = StepObserver(runner, result.stats)
    recent = observer.recent(limit=50)
    assert len(recent) == 50
    records = list(result.stats.steps)[-50:]
    shapes = [s for _, s in runner.noted()][-50:]
    assert [s.shape for s in recent] == shapes
    assert [s.seconds for s in recent] == [r.wall_s for r in records]
    runner.shapes.append((runner.executed + 1, shapes[-1]))  # a step not recorded yet
    assert len(observer.recent(limit=1000)) == 63  # the oldest left the window; the new one waits
