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

The cost model is chosen once at start (``sim.calibrations.choose``: ``--cost-model`` wins,
then the stored calibration of the served model, dtype, CPU kind and attention path); every
answer names the calibration it used (path, when made), and without one it says
"uncalibrated" with the ``servedeck calibrate`` command that makes one (``calibrate_command``).
"""

from __future__ import annotations

import logging
import multiprocessing
import shlex
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

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
from control.policy.schemas import CalibrationUsed, PolicySettings, Prediction, SettingPrediction
from engine.config import EngineConfig, EngineLimits
from engine.cpu import choose_dtype
from sim.calibrations import CalibrationRef
from sim.correction import StepSource, step_ratio
from sim.trace import TraceRequest

__all__ = [
    "TIMED_OUT",
    "UNCALIBRATED",
    "PredictionUnavailable",
    "Predictor",
    "simulate_settings",
    "summarise",
    "unavailable",
]

log = logging.getLogger(__name__)

UNCALIBRATED = (
    "uncalibrated: no prediction without a calibration of the served model, dtype and CPU kind"
)
DEFAULT_CALIBRATE = "servedeck calibrate"


def uncalibrated(command: str = DEFAULT_CALIBRATE) -> str:
    """The dry run's answer without a cost model: what is missing and the command that makes
    it (the server finds the stored calibration at its next start)."""
    return (
        f"{UNCALIBRATED}; make one with `{command}` and restart the server (or start it with "
        "--cost-model FILE or a profile)"
    )


NO_COST_MODEL = uncalibrated()
NO_TRAFFIC = "no prediction: no traffic recorded yet"
BUSY = "no prediction: another prediction is running"
RESULT_GRACE_S = 0.25
"""How long past the deadline the server waits for the worker to report that it stopped."""


class PredictionUnavailable(Exception):
    """No prediction, and why (``reason``, a sentence for a person)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def unavailable(
    reason: str,
    cost_model: str | None = None,
    trace: int = 0,
    calibration: CalibrationUsed | None = None,
    command: str | None = None,
) -> Prediction:
    return Prediction(
        available=False,
        reason=reason,
        cost_model=cost_model,
        calibration=calibration,
        calibrate_command=command,
        trace_requests=trace,
        statement=reason,
    )


def calibrate_command(config: EngineConfig, model: Path | None) -> str:
    """The ``servedeck calibrate`` that makes a calibration of the engine ``config`` describes
    (``model``: the one asked for, None for the embedded default)."""
    parts = [DEFAULT_CALIBRATE]
    if model is not None:
        parts += ["--model", shlex.quote(str(Path(model).resolve()))]
    if config.device != "cpu":
        parts += ["--device", config.device]
    if config.weights_dtype != choose_dtype("auto", config.device).dtype:  # calibrate's default
        parts += ["--dtype", config.weights_dtype]
    if not config.native_attention:
        parts.append("--no-native-attention")
    if config.num_threads:
        parts += ["--threads", str(config.num_threads)]
    return " ".join(parts)


def _used(ref: CalibrationRef | None) -> CalibrationUsed | None:
    if ref is None:
        return None
    return CalibrationUsed(path=ref.path, created=ref.created, source=ref.source)


class Predictor:
    """The server's side: one warm worker process, one prediction at a time."""

    def __init__(
        self,
        cost_model: str | None,
        limits: EngineLimits,
        timeout_s: float,
        max_requests: int,
        calibration: CalibrationRef | None = None,
        command: str = DEFAULT_CALIBRATE,
        steps: StepSource | None = None,
    ) -> None:
        self.spec = cost_model
        self.steps = steps
        """The engine's recent steps (shape and wall time), which correct every prediction;
        None where this process does not see them (a fleet's replicas)."""
        self.calibration = _used(calibration)
        """The calibration file ``cost_model`` is, and where it came from (every answer
        names it)."""
        self.command = command
        """The command that makes a calibration of the served engine (said when there is
        none)."""
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
            return unavailable(uncalibrated(self.command), command=self.command)
        trace = arrivals.trace(self.max_requests)
        correction = self.correction()
        try:
            now, then = self.evaluate(trace, [current, candidate], None, correction or 1.0)
        except PredictionUnavailable as exc:
            return unavailable(exc.reason, self.name, len(trace), self.calibration)
        corrected = (
            f", every step x{correction:.3g} (observed / predicted over the engine's recent steps)"
            if correction is not None
            else ", uncorrected (no engine steps seen yet)"
        )
        return Prediction(
            available=True,
            cost_model=self.name,
            calibration=self.calibration,
            correction=correction,
            trace_requests=len(trace),
            statement=(
                f"a prediction by the cost model {self.name!r}{self._made()}{corrected}, on "
                f"the last {len(trace)} recorded requests (simulated, not measured)"
            ),
            current=now,
            candidate=then,
        )

    def correction(self) -> float | None:
        """How much slower the engine runs than the cost model says: observed ÷ predicted
        over the engine's recent steps (``sim.correction.step_ratio``, clamped); None without
        a cost model or a step seen. The dry run and the guardrail scale every step by it."""
        if not self.available or self.steps is None:
            return None
        assert self.spec is not None
        return step_ratio(cached_cost_model(self.spec), self.steps())

    def _made(self) -> str:
        """Which calibration, in words: ``(calibration PATH, made WHEN; stored)``."""
        used = self.calibration
        if used is None:
            return ""
        return f" (calibration {used.path}, made {used.created}; {used.source})"

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
            raise PredictionUnavailable(uncalibrated(self.command))
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
        future: Future[list[SettingPrediction]] = self._executor.submit(
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
