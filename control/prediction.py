"""Predictions for a dry run: the what-if simulator replays the recorded traffic under the
setting in force and under the candidate, in a separate process.

The simulation runs in one spawned worker process (``ProcessPoolExecutor``), so a dry run
never takes the engine's GIL or its cores' time beyond that process; the trace is capped to the
most recent requests and the run to a wall-clock deadline. The worker enforces the deadline
itself (its cost model raises once the deadline has passed, so a long simulation stops at the
next step instead of keeping the worker busy), and the server stops waiting at the same time.
Without a cost model, without recorded traffic, on a timeout or a failure the answer says
there is no prediction and why.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache

from control.arrivals import ArrivalLog
from control.schemas import PolicySettings, Prediction, SettingPrediction
from engine.config import EngineLimits
from engine.outputs import RequestMetrics
from engine.stats import percentile
from sim.cost_model import CostModel, StepShape
from sim.trace import TraceRequest

log = logging.getLogger(__name__)

TIMED_OUT = "no prediction: timed out"
RESULT_GRACE_S = 0.25
"""How long past the deadline the server waits for the worker to report that it stopped."""


class DeadlinePassed(Exception):
    """Raised inside the worker when the simulation ran out of its time."""


@lru_cache(maxsize=4)
def _cost_model(spec: str) -> CostModel:
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


WORKER_NICENESS = 10
"""The worker runs at the lowest CPU priority: on a machine whose cores the engine uses, a
prediction takes what the engine leaves."""


def lower_priority() -> None:
    """The worker's initializer."""
    os.nice(WORKER_NICENESS)


def warm(spec: str) -> str:
    """Run once in the worker at start: a one-request simulation imports and loads everything
    (simulator, policies, cost model), so the first dry run pays for none of it."""
    from sim.simulator import simulate

    model = _cost_model(spec)
    simulate([TraceRequest(0.0, 1, 1)], model, "continuous", None)
    return model.name


def simulate_settings(
    spec: str,
    trace: list[TraceRequest],
    limits: EngineLimits,
    settings: list[PolicySettings],
    deadline: float,
) -> list[SettingPrediction]:
    """In the worker: simulate ``trace`` once per setting and summarise each run."""
    from sim.calibrated import CalibratedModel
    from sim.simulator import SimSetup, simulate

    inner = _cost_model(spec)
    model = _Deadline(inner, deadline)
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
        result = simulate(trace, model, setting.policy, setup)
        predictions.append(summarise([r.metrics for r in result.records]))
    return predictions


def summarise(metrics: list[RequestMetrics]) -> SettingPrediction:
    """Output tok/s over the run (first arrival to last finish), TTFT p50/p99, TPOT p50."""
    done = [m for m in metrics if m.finish_time is not None]
    tokens = sum(len(m.token_times) for m in done)
    span = max((m.finish_time for m in done), default=0.0) - min(
        (m.arrival_time for m in done), default=0.0
    )
    ttfts = [m.ttft for m in done if m.ttft is not None]
    tpots = [m.tpot for m in done if m.tpot is not None]
    return SettingPrediction(
        output_tokens_per_s=tokens / span if span > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50),
        requests=len(done),
    )


def unavailable(reason: str, cost_model: str | None = None, trace: int = 0) -> Prediction:
    return Prediction(
        available=False,
        reason=reason,
        cost_model=cost_model,
        trace_requests=trace,
        statement=reason,
    )


class Predictor:
    """The server's side: one warm worker process, one prediction at a time."""

    def __init__(
        self,
        cost_model: str | None,
        limits: EngineLimits,
        timeout_s: float,
        max_requests: int,
    ) -> None:
        self.spec = cost_model
        self.limits = limits
        self.timeout_s = timeout_s
        self.max_requests = max_requests
        self.name: str | None = None
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        if cost_model is not None:
            self.name = _cost_model(cost_model).name  # a bad file or name fails the start
            self._executor = self._start()

    def _start(self) -> ProcessPoolExecutor:
        assert self.spec is not None
        executor = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=lower_priority
        )
        executor.submit(warm, self.spec)
        return executor

    def predict(
        self, arrivals: ArrivalLog, current: PolicySettings, candidate: PolicySettings
    ) -> Prediction:
        """Both settings on the most recent ``max_requests`` recorded arrivals."""
        if self.spec is None or self._executor is None:
            return unavailable(
                "no prediction: the server has no cost model (start it with --cost-model)"
            )
        trace = arrivals.trace(self.max_requests)
        if not trace:
            return unavailable("no prediction: no traffic recorded yet", self.name)
        if not self._lock.acquire(blocking=False):
            return unavailable("no prediction: another prediction is running", self.name)
        try:
            return self._predict(trace, current, candidate)
        finally:
            self._lock.release()

    def _predict(
        self, trace: list[TraceRequest], current: PolicySettings, candidate: PolicySettings
    ) -> Prediction:
        assert self._executor is not None and self.spec is not None
        deadline = time.time() + self.timeout_s
        future: Future = self._executor.submit(
            simulate_settings, self.spec, trace, self.limits, [current, candidate], deadline
        )
        try:
            now, then = future.result(self.timeout_s + RESULT_GRACE_S)
        except (FutureTimeout, DeadlinePassed):
            if not future.done():  # stuck outside a step: a fresh worker for the next one
                self._restart()
            return unavailable(TIMED_OUT, self.name, len(trace))
        except Exception as exc:
            log.exception("prediction failed")
            reason = f"no prediction: the simulation failed ({type(exc).__name__}: {exc})"
            return unavailable(reason, self.name, len(trace))
        return Prediction(
            available=True,
            cost_model=self.name,
            trace_requests=len(trace),
            statement=(
                f"a prediction by the cost model {self.name!r} on the last {len(trace)} "
                "recorded requests (simulated, not measured)"
            ),
            current=now,
            candidate=then,
        )

    def _restart(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = self._start()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
