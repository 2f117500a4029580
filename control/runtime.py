"""What one server process holds: the app context (settings, database, metrics) and, once the
model has loaded, the runtime (engine loop, policy store, maintenance).

The model loads on a thread after the server started listening, so ``GET /health`` can
answer 503 meanwhile; everything else that needs the engine waits for ``ctx.runtime``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlmodel import Session

from control.core.config import Settings
from control.maintenance import Maintenance
from control.metrics import ControlMetrics
from control.schemas import PolicySettings
from control.store import PolicyStore, seed, with_overrides
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.engine import LLMEngine
from policies.base import PolicySpec
from policies.registry import validate_params

log = logging.getLogger(__name__)

APPLY_TIMEOUT_S = 30.0


class Runtime:
    def __init__(
        self,
        model_name: str,
        engine: AsyncEngine,
        maintenance: Maintenance,
        metrics: ControlMetrics,
        version: int,
    ) -> None:
        self.model_name = model_name
        self.engine = engine
        self.maintenance = maintenance
        self.metrics = metrics
        self.version = version
        self.created = int(time.time())
        self.store: PolicyStore  # set by load_runtime: the store applies through this runtime

    @property
    def llm_engine(self) -> LLMEngine:
        return self.engine.engine

    def apply(self, before: PolicySettings, after: PolicySettings, version: int) -> None:
        """Put a stored version into force: policy and reserve at the next step boundary,
        the sweep rescheduled, the metrics relabelled."""
        futures = []
        if after.policy != before.policy:
            futures.append(self.llm_engine.set_policy(after.policy))
        if after.memory_reserve != before.memory_reserve:
            futures.append(self.llm_engine.set_memory_reserve(after.memory_reserve))
        for future in futures:
            future.result(APPLY_TIMEOUT_S)
        self.maintenance.reschedule(after.reclaim_interval_s)
        self.version = version
        self.metrics.set_policy(after.policy.name, version)
        log.info("policy version %d in force: %s", version, after.model_dump_json())

    def close(self) -> None:
        self.maintenance.shutdown()
        self.engine.shutdown()


@dataclass
class AppContext:
    settings: Settings
    admin_token: str
    db: Engine
    metrics: ControlMetrics = field(default_factory=ControlMetrics)
    runtime: Runtime | None = None
    load_error: str | None = None

    def load(self) -> None:
        """Load the model and start everything that needs it (runs on a loader thread)."""
        try:
            self.runtime = load_runtime(self.settings, self.db, self.metrics)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("could not start the engine")

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
        self.db.dispose()


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
    overrides = overrides_of(settings)
    with Session(db) as session:
        row = seed(session)
    in_force = with_overrides(row, overrides)
    model_dir = settings.model_dir()
    config = EngineConfig(
        model=str(model_dir),
        policy=in_force.policy.name,
        device=settings.device,
        dtype=settings.dtype,
        block_size=settings.block_size,
        num_kv_blocks=settings.num_kv_blocks,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        memory_reserve=in_force.memory_reserve,
        max_waiting=settings.max_waiting,
        num_threads=settings.num_threads,
    )
    log.info("loading %s", model_dir)
    llm_engine = LLMEngine.from_config(config)
    spec = in_force.policy
    try:
        validate_params(spec, llm_engine.limits)
    except ValidationError as exc:
        log.error("stored %s params do not fit this engine, using defaults: %s", spec.name, exc)
        spec = PolicySpec(name=spec.name)
    llm_engine.set_policy(spec).result()  # this thread owns the engine until the loop starts
    engine = AsyncEngine(llm_engine, on_finished=metrics.observe_finished)
    maintenance = Maintenance(
        llm_engine, db, metrics, in_force.reclaim_interval_s, settings.maintenance_retention
    )
    runtime = Runtime(
        settings.served_model_name or model_dir.name, engine, maintenance, metrics, row.version
    )
    runtime.store = PolicyStore(llm_engine.limits, runtime.apply, metrics, overrides)
    engine.start()
    maintenance.start()
    metrics.set_policy(spec.name, row.version)
    log.info("serving %s with policy version %d (%s)", runtime.model_name, row.version, spec.name)
    return runtime
