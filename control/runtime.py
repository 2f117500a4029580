"""What one server process holds: the app context (settings, database, metrics) and, once the
model has loaded, the runtime (engine loop, policy store, maintenance).

The model loads on a thread after the server started listening, so ``GET /health`` can
answer 503 meanwhile; everything else that needs the engine waits for ``ctx.runtime``.
``AppContext.not_ready`` says why ``GET /ready`` is 503 (loading, failed, draining, stalled).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from control.arrivals import ArrivalLog
from control.chat_render import ChatRenderer
from control.core.config import Settings
from control.demo_load import DemoLoad
from control.guardrail.service import JOB_ID as GUARDRAIL_JOB_ID
from control.guardrail.service import TICK_S as GUARDRAIL_TICK_S
from control.guardrail.service import Guardrail
from control.maintenance import Maintenance
from control.memory_trim import JOB_ID as MEMORY_TRIM_JOB_ID
from control.memory_trim import TICK_S as MEMORY_TRIM_TICK_S
from control.memory_trim import MemoryTrim
from control.metrics import ControlMetrics
from control.policy_rows import seed, with_overrides
from control.prediction import Predictor
from control.schedule_store import JOB_ID as SCHEDULE_JOB_ID
from control.schedule_store import TICK_S as SCHEDULE_TICK_S
from control.schedule_store import Schedules
from control.schemas import NotReady, PolicySettings
from control.store import PolicyStore
from control.watchdog import JOB_ID as WATCHDOG_JOB_ID
from control.watchdog import StallWatchdog, check_interval
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from policies.spec import check_caps, default_spec

if TYPE_CHECKING:
    from control.fleet.fleet import Fleet

log = logging.getLogger(__name__)

RECONCILE_JOB_ID = "policy_reconcile"
RECONCILE_INTERVAL_S = 2.0
RECONCILE_ATTEMPT_S = 1.0
"""Each retry of a pending version waits this long for the engine, holding the store lock."""
DRAIN_POLL_S = 0.05


@dataclass
class _Pending:
    """A version handed to the engine and not yet confirmed: a retry waits on the same
    commands instead of sending them again."""

    version: int
    futures: list[Future]


class Runtime:
    def __init__(
        self,
        model_name: str,
        engine: AsyncEngine,
        maintenance: Maintenance,
        metrics: ControlMetrics,
        version: int,
        in_force: PolicySettings,
        apply_timeout_s: float,
        watchdog: StallWatchdog,
    ) -> None:
        self.model_name = model_name
        self.engine = engine
        self.maintenance = maintenance
        self.metrics = metrics
        self.version = version
        """The version in force (a newer one may still be pending)."""
        self.in_force = in_force
        self.apply_timeout_s = apply_timeout_s
        self.watchdog = watchdog
        self.created = int(time.time())
        self.store: PolicyStore  # set by load_runtime: the store applies through this runtime
        self.arrivals = ArrivalLog()
        """Recent arrivals (times and lengths); load_runtime feeds it from on_finished."""
        self.predictor: Predictor | None = None  # set by load_runtime
        self.schedules: Schedules  # set by load_runtime
        self.guardrail: Guardrail  # set by load_runtime
        self.renderer: ChatRenderer  # set by load_runtime: the chat template's workers
        self._apply_lock = threading.Lock()
        self._pending: _Pending | None = None
        self.fleet: Fleet | None = None
        """With ``--replicas``: the engine replicas (``engine`` is then their client and
        ``llm_engine`` this process's idle engine: tokenizer, limits, admission)."""

    @property
    def llm_engine(self) -> LLMEngine:
        return self.engine.engine

    def apply(self, settings: PolicySettings, version: int, timeout: float | None = None) -> None:
        """Put a stored version into force: policy and reserve at the next step boundary,
        the sweep rescheduled, the metrics relabelled. ``TimeoutError`` when the engine has
        not taken it within ``timeout`` (default ``apply_timeout_s``): the commands stay
        queued and a retry of the same version waits on them."""
        timeout = self.apply_timeout_s if timeout is None else timeout
        with self._apply_lock:
            if self.fleet is not None:  # every replica acknowledges first (or this raises)
                self.fleet.apply(settings, version, timeout)
            pending = self._pending
            if pending is None or pending.version != version:
                self._pending = None
                pending = self._pending = _Pending(version, self._submit(settings, version))
            deadline = time.monotonic() + timeout
            try:
                for future in pending.futures:
                    future.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise
            except BaseException:
                self._pending = None
                raise
            self._pending = None
            self.in_force = settings
        self.maintenance.reschedule(settings.reclaim_interval_s)
        self.version = version
        self.metrics.set_policy(settings.policy.name, version)
        log.info("policy version %d in force: %s", version, settings.model_dump_json())

    def _submit(self, settings: PolicySettings, version: int) -> list[Future]:
        futures: list[Future] = []
        if settings.policy != self.in_force.policy:
            futures.append(self.llm_engine.set_policy(settings.policy, version=version))
        if settings.memory_reserve != self.in_force.memory_reserve:
            futures.append(self.llm_engine.set_memory_reserve(settings.memory_reserve))
        return futures

    def reconcile(self, db: Engine) -> None:
        """The maintenance job: retry the newest version while it is pending."""
        with Session(db) as session:
            self.store.reconcile(session, RECONCILE_ATTEMPT_S)

    def wait_idle(self, timeout: float) -> bool:
        """Until the engine holds no request (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        while self.llm_engine.has_unfinished_requests() or (self.fleet and self.fleet.in_flight()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(DRAIN_POLL_S)
        return True

    def cut_off(self, reason: str) -> int:
        """End every request still in flight now with ``EngineStopped(reason)``; how many."""
        if self.fleet is not None:
            return self.fleet.engine.cut_off_all(reason)
        return self.engine.cut_off(reason)

    def close(self) -> None:
        self.maintenance.shutdown()
        self.guardrail.close()
        self.engine.shutdown()
        if self.fleet is not None:
            self.fleet.close()
        if self.predictor is not None:
            self.predictor.close()
        self.renderer.close()


@dataclass
class AppContext:
    settings: Settings
    admin_token: str
    db: Engine
    metrics: ControlMetrics = field(default_factory=ControlMetrics)
    runtime: Runtime | None = None
    load_error: str | None = None
    draining: threading.Event = field(default_factory=threading.Event)
    """Set on SIGTERM: /ready is 503 and new requests are refused while in-flight ones end."""
    demo_load: DemoLoad | None = None
    """The load the server sends itself with ``--demo-load`` (started once the model loaded)."""

    def load(self) -> None:
        """Load the model and start everything that needs it (runs on a loader thread)."""
        try:
            self.runtime = load_runtime(self.settings, self.db, self.metrics)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("could not start the engine")
            return
        if (rate := self.settings.demo_load) is not None:
            key = self.settings.api_key
            api_key = key.get_secret_value() if key is not None else None
            self.demo_load = DemoLoad(self.settings.local_url(), api_key, rate).start()
            log.info("sending a demo load of %g requests/s to itself", rate)

    def not_ready(self) -> NotReady | None:
        """Why the server should get no new traffic now; None when it is ready."""
        runtime = self.runtime
        if self.draining.is_set():
            return NotReady(reason="draining", detail="shutting down: in-flight requests finish")
        if runtime is None and self.load_error is None:
            return NotReady(reason="loading", detail="the model is still loading")
        if runtime is None or not runtime.engine.is_running:
            return NotReady(reason="failed", detail=self.load_error or "the engine loop stopped")
        if (stall := runtime.watchdog.stall) is not None:
            return NotReady(reason="stalled", detail=stall)
        return None

    def drain(self, timeout: float) -> bool:
        """Refuse new work, then wait up to ``timeout`` for the requests in flight."""
        self.draining.set()
        if self.demo_load is not None:
            self.demo_load.stop()
        if self.runtime is None:
            return True
        log.info("draining: waiting up to %.0f s for the requests in flight", timeout)
        drained = self.runtime.wait_idle(timeout)
        if not drained:
            cut = self.runtime.cut_off(
                f"the server shut down before the request finished (its drain timeout of "
                f"{timeout:g} s passed); retry the request"
            )
            log.warning(
                "drain timeout after %g s: %d request(s) still in flight cut off (engine_stopped)",
                timeout,
                cut,
            )
        return drained

    def close(self) -> None:
        if self.demo_load is not None:
            self.demo_load.stop()
        if self.runtime is not None:
            self.runtime.close()
        checkpoint(self.db)
        self.db.dispose()


def checkpoint(db: Engine) -> None:
    """Fold the WAL back into the database file, so a closed database is one clean file."""
    try:
        with db.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    except Exception:
        log.exception("WAL checkpoint at shutdown failed")


def finished_hook(metrics: ControlMetrics, arrivals: ArrivalLog) -> Callable[[RequestOutput], None]:
    """The engine's hook for a finished request: the latency metrics and the arrival record."""

    def on_finished(output: RequestOutput) -> None:
        metrics.observe_finished(output)
        arrivals.record(output)

    return on_finished


def overrides_of(settings: Settings) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if settings.policy is not None:
        overrides["policy.name"] = settings.policy
    if settings.memory_reserve is not None:
        overrides["memory_reserve"] = settings.memory_reserve
    if settings.reclaim_interval_s is not None:
        overrides["reclaim_interval_s"] = settings.reclaim_interval_s
    return overrides


def load_runtime(settings: Settings, db: Engine, metrics: ControlMetrics) -> Runtime:
    renderer = ChatRenderer(  # its workers start while the model loads
        settings.chat_template_workers,
        settings.chat_template_timeout_s,
        settings.max_chat_template_output,
        metrics,
        preload=Path(settings.tokenizer) if settings.tokenizer else settings.model_dir(),
    )
    try:
        runtime = _load_runtime(settings, db, metrics, renderer)
    except BaseException:
        renderer.close()
        raise
    if not renderer.wait_ready():
        log.error("the chat template workers did not start: chat requests wait for them")
    return runtime


def _load_runtime(
    settings: Settings, db: Engine, metrics: ControlMetrics, renderer: ChatRenderer
) -> Runtime:
    overrides = overrides_of(settings)
    with Session(db) as session:
        row = seed(session)
    in_force = with_overrides(row, overrides)
    model_dir = settings.model_dir()
    config = EngineConfig(
        model=str(model_dir),
        policy=in_force.policy.name,
        memory_reserve=in_force.memory_reserve,
        **settings.engine_values(),
    )
    log.info("loading %s", model_dir)
    llm_engine = LLMEngine.from_config(config)
    spec, refused = in_force.policy, None
    try:
        check_caps(spec, llm_engine.limits)  # parsed once with its row
    except ValidationError as exc:
        log.error("stored %s params do not fit this engine, using defaults: %s", spec.name, exc)
        refused = f"the params do not fit this engine (its defaults run instead): {exc}"
        spec = default_spec(spec.name)
    llm_engine.set_policy(spec, version=row.version).result()  # this thread owns the engine
    in_force.policy = spec
    predictor = Predictor(
        settings.cost_model,
        llm_engine.limits,
        settings.prediction_timeout_s,
        settings.prediction_max_requests,
    )
    arrivals = ArrivalLog()
    on_finished = finished_hook(metrics, arrivals)
    engine: Any = AsyncEngine(llm_engine, on_finished=on_finished)
    fleet = None
    if settings.replicas is not None:  # the engines run on Ray Serve; this one stays idle
        from control.fleet.fleet import Fleet

        fleet = Fleet.launch(settings, config, in_force, row.version, engine, on_finished)
        engine = fleet.engine
    maintenance = Maintenance(
        fleet or llm_engine,  # type: ignore[arg-type]  # the fleet sweeps every replica
        db,
        metrics,
        in_force.reclaim_interval_s,
        settings.maintenance_retention,
    )
    watchdog = StallWatchdog(engine, metrics, settings.stall_timeout_s)
    runtime = Runtime(
        settings.served_model_name or (model_dir.stem if model_dir.is_file() else model_dir.name),
        engine,
        maintenance,
        metrics,
        row.version,
        in_force,
        settings.policy_apply_timeout_s,
        watchdog,
    )
    runtime.predictor, runtime.arrivals, runtime.renderer = predictor, arrivals, renderer
    if fleet is not None:
        fleet.attach(runtime, maintenance)
    runtime.store = PolicyStore(llm_engine.limits, runtime.apply, metrics, overrides)
    state = "failed" if refused else "applied"
    if (row.state, row.state_reason) != (state, refused):  # the newest version is in force now
        try:
            with Session(db) as session:
                runtime.store.mark(session, row.version, state, refused)
        except SQLAlchemyError as exc:  # serve anyway: the reconcile job records it later
            log.warning("version %d is in force; its state was not written: %s", row.version, exc)
    maintenance.add_job(
        RECONCILE_JOB_ID,
        "retry the pending policy version",
        lambda: runtime.reconcile(db),
        RECONCILE_INTERVAL_S,
    )
    runtime.schedules = Schedules(db, runtime.store, metrics, max_schedules=settings.max_schedules)
    maintenance.add_job(
        SCHEDULE_JOB_ID, "schedule windows", runtime.schedules.tick, SCHEDULE_TICK_S
    )
    runtime.guardrail = Guardrail(
        db, runtime.store, predictor, arrivals, runtime.schedules, metrics
    )
    maintenance.add_job(GUARDRAIL_JOB_ID, "SLO guardrail", runtime.guardrail.tick, GUARDRAIL_TICK_S)
    maintenance.add_job(
        WATCHDOG_JOB_ID,
        "engine stall watchdog",
        watchdog.check,
        check_interval(settings.stall_timeout_s),
    )
    trim = MemoryTrim(engine)
    maintenance.add_job(
        MEMORY_TRIM_JOB_ID, "give memory back after a load", trim.tick, MEMORY_TRIM_TICK_S
    )
    engine.start()
    maintenance.start()
    metrics.set_policy(spec.name, row.version)
    log.info("serving %s with policy version %d (%s)", runtime.model_name, row.version, spec.name)
    return runtime
