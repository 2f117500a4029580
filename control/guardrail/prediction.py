"""Predictions: the what-if simulator replays the recorded traffic under given settings, in a
separate process. The dry run asks for two (the setting in force and the candidate), the
guardrail for many at once.

The simulation runs in one spawned worker process (``ProcessPoolExecutor``; its side is
``control.guardrail.prediction_worker``), so a prediction never takes the engine's GIL or its cores'
time beyond that process; the trace is capped to the most recent requests and each request
for predictions (however many settings) to one wall-clock deadline, which the worker enforces
itself and the server waits no longer than. Without a cost model, without recorded traffic,
on a timeout or a failure the answer says there is no prediction and why (the dry run's
``Prediction``, or ``PredictionUnavailable`` from ``evaluate``).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from control.arrivals import ArrivalLog
from control.guardrail.prediction_worker import (
    TIMED_OUT,
    DeadlinePassed,
    cached_cost_model,
    lower_priority,
    simulate_settings,
    summarise,
    warm,
)
from control.guardrail.schemas import Objectives
from control.policy.schemas import PolicySettings, Prediction, SettingPrediction
from engine.config import EngineLimits
from sim.trace import TraceRequest

__all__ = [
    "TIMED_OUT",
    "PredictionUnavailable",
    "Predictor",
    "simulate_settings",
    "summarise",
    "unavailable",
]

log = logging.getLogger(__name__)

NO_COST_MODEL = "no prediction: the server has no cost model (start it with --cost-model)"
NO_TRAFFIC = "no prediction: no traffic recorded yet"
BUSY = "no prediction: another prediction is running"
RESULT_GRACE_S = 0.25
"""How long past the deadline the server waits for the worker to report that it stopped."""


class PredictionUnavailable(Exception):
    """No prediction, and why (``reason``, a sentence for a person)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
            self.name = cached_cost_model(cost_model).name  # a bad file or name fails the start
            self._executor = self._start()

    def _start(self) -> ProcessPoolExecutor:
        assert self.spec is not None
        executor = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=lower_priority
        )
        executor.submit(warm, self.spec)
        return executor

    @property
    def available(self) -> bool:
        """Whether there is a cost model (and so a worker) to predict with."""
        return self.spec is not None and self._executor is not None

    def predict(
        self, arrivals: ArrivalLog, current: PolicySettings, candidate: PolicySettings
    ) -> Prediction:
        """The dry run's: both settings on the most recent ``max_requests`` recorded arrivals."""
        if not self.available:
            return unavailable(NO_COST_MODEL)
        trace = arrivals.trace(self.max_requests)
        try:
            now, then = self.evaluate(trace, [current, candidate], None)
        except PredictionUnavailable as exc:
            return unavailable(exc.reason, self.name, len(trace))
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

    def evaluate(
        self,
        trace: list[TraceRequest],
        settings: list[PolicySettings],
        objectives: Objectives | None,
        scale: float = 1.0,
        timeout_s: float | None = None,
    ) -> list[SettingPrediction]:
        """Each setting's prediction on ``trace``, in order, every step priced ``scale`` times
        the cost model's (the guardrail's correction); goodput filled when ``objectives`` are
        given. All in one worker call under one deadline (``timeout_s``, the predictor's
        own when None: a background job may give many settings longer than a dry run). Raises
        ``PredictionUnavailable`` without a cost model or traffic, while another prediction
        runs, on the timeout or on a failure."""
        if not self.available:
            raise PredictionUnavailable(NO_COST_MODEL)
        if not trace:
            raise PredictionUnavailable(NO_TRAFFIC)
        if not self._lock.acquire(blocking=False):
            raise PredictionUnavailable(BUSY)
        try:
            return self._evaluate(trace, settings, objectives, scale, timeout_s or self.timeout_s)
        finally:
            self._lock.release()

    def _evaluate(
        self,
        trace: list[TraceRequest],
        settings: list[PolicySettings],
        objectives: Objectives | None,
        scale: float,
        timeout_s: float,
    ) -> list[SettingPrediction]:
        assert self._executor is not None and self.spec is not None
        deadline = time.time() + timeout_s
        future: Future = self._executor.submit(
            simulate_settings,
            self.spec,
            trace,
            self.limits,
            settings,
            deadline,
            scale,
            objectives,
        )
        try:
            return future.result(timeout_s + RESULT_GRACE_S)
        except (FutureTimeout, DeadlinePassed):
            if not future.done():  # stuck outside a step: a fresh worker for the next one
                self._restart()
            raise PredictionUnavailable(TIMED_OUT) from None
        except Exception as exc:
            log.exception("prediction failed")
            reason = f"no prediction: the simulation failed ({type(exc).__name__}: {exc})"
            raise PredictionUnavailable(reason) from exc

    def _restart(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = self._start()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
