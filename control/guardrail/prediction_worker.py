"""The prediction worker's side: what runs in the spawned process
(``control.guardrail.prediction``).

One function, ``simulate_settings``, replays a trace once per setting and summarises each
run; the dry run and the guardrail both call it. The worker enforces the deadline itself (its
cost model raises once the deadline has passed, so a long simulation stops at the next step
instead of keeping the worker busy).
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import TYPE_CHECKING

from control.guardrail.observed import within
from control.guardrail.schemas import Objectives
from control.policy.schemas import PolicySettings, SettingPrediction
from engine.config import EngineLimits
from engine.stats import percentile
from engine.tenants import ServiceCost
from engine.timeline import HeldShare
from sim.cost_model import CostModel, Scaled, StepShape
from sim.groups import by_priority, by_tenant
from sim.trace import TraceRequest

if TYPE_CHECKING:
    from sim.simulator import SimRecord

TIMED_OUT = "no prediction: timed out"
WORKER_NICENESS = 10
"""The worker runs at the lowest CPU priority: on a machine whose cores the engine uses, a
prediction takes what the engine leaves."""


class DeadlinePassed(Exception):
    """Raised inside the worker when the simulation ran out of its time."""


@lru_cache(maxsize=4)
def cached_cost_model(spec: str) -> CostModel:
    from sim.models import load_cost_model

    return load_cost_model(spec)


class _Deadline(CostModel):
    """The worker's cost model: the real one, refusing to price a step after ``deadline``."""

    def __init__(self, inner: CostModel, deadline: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.deadline = deadline

    def step_time(self, shape: StepShape) -> float:
        if time.time() > self.deadline:
            raise DeadlinePassed(TIMED_OUT)
        return self.inner.step_time(shape)

    def kv_cache_blocks(self, block_size: int) -> int | None:
        return self.inner.kv_cache_blocks(block_size)


def lower_priority() -> None:
    """The worker's initializer."""
    os.nice(WORKER_NICENESS)


def warm(spec: str) -> str:
    """Run once in the worker at start: a one-request simulation imports and loads everything
    (simulator, policies, cost model), so the first prediction pays for none of it."""
    from sim.simulator import simulate

    model = cached_cost_model(spec)
    simulate([TraceRequest(0.0, 1, 1)], model, "continuous", None)
    return model.name


def simulate_settings(
    spec: str,
    trace: list[TraceRequest],
    limits: EngineLimits,
    settings: list[PolicySettings],
    deadline: float,
    scale: float = 1.0,
    objectives: Objectives | None = None,
) -> list[SettingPrediction]:
    """In the worker: simulate ``trace`` once per setting, every step priced ``scale`` times
    the cost model's, and summarise each run (goodput against ``objectives`` if given)."""
    from sim.calibrated import CalibratedModel
    from sim.simulator import SimSetup, simulate

    inner = cached_cost_model(spec)
    model = _Deadline(inner if scale == 1.0 else Scaled(inner, scale), deadline)
    # A calibration is of this machine: the server's own pool (its --num-kv-blocks) is the
    # truth. A profile of another GPU sizes the pool a real engine would have there.
    blocks = limits.num_kv_blocks if isinstance(inner, CalibratedModel) else None
    predictions = []
    for setting in settings:
        setup = SimSetup(
            block_size=limits.block_size,
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            memory_reserve=setting.memory_reserve,
            max_model_len=limits.max_model_len,
            num_kv_blocks=blocks,
        )
        result = simulate(trace, model, setting.policy, setup, queue=setting.queue)
        cost = setting.queue.cost()
        predictions.append(summarise(result.records, objectives, cost, result.waits))
    return predictions


def summarise(
    records: list[SimRecord],
    objectives: Objectives | None = None,
    cost: ServiceCost | None = None,
    waits: tuple[HeldShare, ...] = (),
) -> SettingPrediction:
    """Output tok/s over the run (first arrival to last finish), TTFT p50/p99, TPOT p50/p99;
    with ``objectives``, goodput: requests per second of the run that met the latency
    objectives (a request without a TPOT, one token long, meets a TPOT objective). With
    objectives of one priority class, these figures are that class's. Per tenant and per
    priority class: service shares (by ``cost``, the queue's) and latency percentiles.
    ``waits``: the run's waiting seconds by reason (``SimResult.waits``, the whole trace's)."""
    judged = [r for r in records if objectives is None or objectives.judged(r.priority)]
    done = [r.metrics for r in judged if r.metrics.finish_time is not None]
    tokens = sum(len(m.token_times) for m in done)
    finishes = [m.finish_time for m in done if m.finish_time is not None]  # all of them
    span = max(finishes, default=0.0) - min((m.arrival_time for m in done), default=0.0)
    ttfts = [m.ttft for m in done if m.ttft is not None]
    tpots = [m.tpot for m in done if m.tpot is not None]
    goodput = None
    if objectives is not None and span > 0:
        good = sum(1 for m in done if within(m, objectives))
        goodput = good / span
    return SettingPrediction(
        output_tokens_per_s=tokens / span if span > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p99_s=percentile(tpots, 99),
        goodput_rps=goodput,
        requests=len(done),
        tenants=by_tenant(records, cost),
        priorities=by_priority(records, cost),
        waits=list(waits),
    )
