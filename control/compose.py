"""The composition root: every part of a server's runtime built once, in dependency order.

``build_runtime`` is the one place that knows the implementations: it picks the engine
service (one ``LocalEngine`` in this process, or a ``Fleet`` of replicas on Ray Serve behind a
tokenizer-only front), builds the parts that depend on it, registers their periodic jobs and
returns a finished ``Runtime``. Nothing is attached afterwards.

Order: the chat template's workers (they start while the model loads), the stored version in
force, the engine service, the sweep's scheduler, the version in force, the policy store,
prediction (its cost model: ``--cost-model`` or the stored calibration of the served engine),
schedules, the guardrail, the stall watchdog; then the jobs and the engine start.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from control.arrivals import ArrivalLog
from control.chat.render import ChatRenderer
from control.core.config import Settings
from control.guardrail.prediction import Predictor, calibrate_command, uncalibrated
from control.guardrail.service import JOB_ID as GUARDRAIL_JOB_ID
from control.guardrail.service import TICK_S as GUARDRAIL_TICK_S
from control.guardrail.service import Guardrail
from control.jobs.maintenance import Maintenance
from control.jobs.watchdog import JOB_ID as WATCHDOG_JOB_ID
from control.jobs.watchdog import StallWatchdog, check_interval
from control.metrics import ControlMetrics
from control.policy.in_force import InForce
from control.policy.rows import seed, with_overrides
from control.policy.schemas import PolicySettings, VersionState
from control.policy.store import PolicyStore
from control.requests_text import TextJournal
from control.runtime import Runtime
from control.schedules.store import JOB_ID as SCHEDULE_JOB_ID
from control.schedules.store import TICK_S as SCHEDULE_TICK_S
from control.schedules.store import Schedules
from control.service.local import LocalEngine
from control.service.protocol import EngineService, TestingHooks
from engine.config import EngineConfig, EngineLimits
from engine.front import EngineFront
from engine.outputs import RequestOutput
from policies.spec import check_caps, default_spec
from serving.engine import LLMEngine
from sim.calibrations import choose, served_identity
from sim.correction import StepSource, observing

log = logging.getLogger(__name__)

RECONCILE_JOB_ID = "policy_reconcile"
RECONCILE_INTERVAL_S = 2.0
RECONCILE_ATTEMPT_S = 1.0
"""Each retry of a pending version waits this long for the engine, holding the store lock."""


def build_runtime(settings: Settings, db: Engine, metrics: ControlMetrics) -> Runtime:
    renderer = ChatRenderer(  # its workers start while the model loads
        settings.chat_template_workers,
        settings.chat_template_timeout_s,
        settings.max_chat_template_output,
        metrics,
        preload=settings.tokenizer_dir() or settings.model_dir(),
    )
    try:
        runtime = _build(settings, db, metrics, renderer)
    except BaseException:
        renderer.close()
        raise
    if not renderer.wait_ready():
        log.error("the chat template workers did not start: chat requests wait for them")
    return runtime


def _build(
    settings: Settings, db: Engine, metrics: ControlMetrics, renderer: ChatRenderer
) -> Runtime:
    overrides = settings.policy_overrides()
    with Session(db) as session:
        row = seed(session)
    stored = with_overrides(row, overrides)
    model_dir = settings.model_dir()
    config = EngineConfig(
        model=str(model_dir),
        policy=stored.policy.name,
        memory_reserve=stored.memory_reserve,
        **settings.engine_values(),
    )
    arrivals = ArrivalLog()
    text = TextJournal() if settings.expose_text else None

    def on_finished(output: RequestOutput) -> None:
        metrics.observe_finished(output)
        arrivals.record(output)
        if text is not None:
            text.settle(output)

    service: EngineService
    testing: TestingHooks | None = None
    attention: str | None = None  # the decode attention in force, where this process knows it
    steps: StepSource | None = None  # the engine's recent steps, where this process sees them
    if settings.replicas is None:
        log.info("loading %s", model_dir)
        llm_engine = LLMEngine.from_config(config)
        in_force, refused = _fitting(stored, llm_engine.front.limits)
        # not started yet: in force before the first request
        llm_engine.set_policy(in_force.policy, version=row.version, queue=in_force.queue).result()
        local = LocalEngine(llm_engine, in_force, on_finished)
        compute = getattr(llm_engine.runner, "compute", None)
        attention = compute.attention if compute is not None else None
        steps = observing(llm_engine).recent  # its steps correct every prediction
        service, testing = local, (local if settings.testing else None)
    else:  # the engines run on Ray Serve; this process holds their tokenizer-only front
        from control.fleet.fleet import Fleet

        front = EngineFront.from_config(config)
        in_force, refused = _fitting(stored, front.limits)
        service = Fleet.launch(settings, config, front, in_force, row.version, on_finished, metrics)
    front = service.front
    maintenance = Maintenance(
        service, db, metrics, in_force.reclaim_interval_s, settings.maintenance_retention
    )
    applied = InForce(
        service, maintenance, metrics, row.version, in_force, settings.policy_apply_timeout_s
    )
    store = PolicyStore(front.limits, applied.apply, metrics, overrides)
    state: VersionState = "failed" if refused else "applied"
    if (row.state, row.state_reason) != (state, refused):  # the newest version is in force now
        try:
            with Session(db) as session:
                store.mark(session, row.version, state, refused)
        except SQLAlchemyError as exc:  # serve anyway: the reconcile job records it later
            log.warning("version %d is in force; its state was not written: %s", row.version, exc)
    served = served_identity(model_dir, config.weights_dtype, config.device, attention)
    cost_model = choose(settings.cost_model, served)  # a foreign calibration fails the start
    command = calibrate_command(config, settings.model)
    if cost_model.spec is None:
        log.info("no cost model: %s", uncalibrated(command))
    else:
        used = cost_model.calibration
        made = f"{used.source} calibration made {used.created}" if used else "a profile"
        log.info("cost model %s (%s)", cost_model.spec, made)
    predictor = Predictor(
        cost_model.spec,
        front.limits,
        settings.prediction_timeout_s,
        settings.prediction_max_requests,
        cost_model.calibration,
        command,
        steps,
    )
    schedules = Schedules(db, store, metrics, max_schedules=settings.max_schedules)
    guardrail = Guardrail(db, store, predictor, arrivals, schedules, metrics)
    watchdog = StallWatchdog(service, metrics, settings.stall_timeout_s)

    def reconcile() -> None:
        with Session(db) as session:
            store.reconcile(session, RECONCILE_ATTEMPT_S)

    maintenance.add_job(
        RECONCILE_JOB_ID, "retry the pending policy version", reconcile, RECONCILE_INTERVAL_S
    )
    maintenance.add_job(SCHEDULE_JOB_ID, "schedule windows", schedules.tick, SCHEDULE_TICK_S)
    maintenance.add_job(GUARDRAIL_JOB_ID, "SLO guardrail", guardrail.tick, GUARDRAIL_TICK_S)
    maintenance.add_job(
        WATCHDOG_JOB_ID,
        "engine stall watchdog",
        watchdog.check,
        check_interval(settings.stall_timeout_s),
    )
    for job in service.jobs():
        maintenance.add_job(job.job_id, job.name, job.run, job.interval_s)
    runtime = Runtime(
        model_name=settings.served_model_name
        or (model_dir.stem if model_dir.is_file() else model_dir.name),
        service=service,
        in_force=applied,
        store=store,
        maintenance=maintenance,
        metrics=metrics,
        arrivals=arrivals,
        predictor=predictor,
        schedules=schedules,
        guardrail=guardrail,
        renderer=renderer,
        watchdog=watchdog,
        text=text,
        testing=testing,
    )
    service.start()
    maintenance.start()
    metrics.set_policy(in_force.policy.name, row.version)
    name = in_force.policy.name
    log.info("serving %s with policy version %d (%s)", runtime.model_name, row.version, name)
    return runtime


def _fitting(stored: PolicySettings, limits: EngineLimits) -> tuple[PolicySettings, str | None]:
    """The stored settings, or with the policy's defaults where its params do not fit this
    engine (and why, for the version's state)."""
    spec = stored.policy
    try:
        check_caps(spec, limits)  # parsed once with its row
    except ValidationError as exc:
        log.error("stored %s params do not fit this engine, using defaults: %s", spec.name, exc)
        refused = f"the params do not fit this engine (its defaults run instead): {exc}"
        return stored.model_copy(update={"policy": default_spec(spec.name)}), refused
    return stored, None
