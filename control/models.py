"""Tables of the control plane's SQLite database. Schema changes only through alembic
revisions in ``migrations/``; ``alembic check`` in the tests keeps these and them in step."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, Literal, Self

from sqlalchemy import JSON, DateTime
from sqlmodel import AutoString, Field, SQLModel

from engine.kv_stats import ReclaimResult

# Before any table is declared: constraint names must be stable for batch migrations on SQLite.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


SQLITE_INTEGER_MAX = 2**63 - 1
"""The largest value an SQLite INTEGER holds: bound every number a query takes from a client."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """SQLite keeps no time zone: every stored time is UTC and comes back naive."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# Any in this module: Field's own keyword arguments and return (the FieldInfo stands for the
# default), and the JSON columns (sa_type=JSON): stored JSON, which a row written by an older
# version keeps as it was.
def timestamp_field(**kwargs: Any) -> Any:
    return Field(sa_type=DateTime(timezone=True), **kwargs)


class PolicyVersion(SQLModel, table=True):
    """One row per policy change; the newest row is the active version."""

    __tablename__ = "policy_version"

    version: int = Field(primary_key=True)
    policy_name: str
    policy_params: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    queue: dict[str, Any] | None = Field(
        default=None,
        sa_type=JSON,
        description="policies.queue.QueueSpec as JSON; null in rows stored before it (fcfs).",
    )
    memory_reserve: float
    reclaim_interval_s: float
    explicit: list[str] = Field(
        default_factory=list,
        sa_type=JSON,
        description="Top-level fields set by a stored change (their source is 'stored').",
    )
    actor: str
    reason: str
    before: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    created_at: datetime = timestamp_field(default_factory=utcnow, index=True)
    rollback_of: int | None = Field(default=None, foreign_key="policy_version.version")
    state: str = Field(
        default="pending",
        description="policy.schemas.VersionState: pending until in force, then applied or failed.",
    )
    state_reason: str | None = Field(default=None, description="Why it failed, or is pending.")
    state_at: datetime | None = timestamp_field(default=None, description="When state was set.")


ReclaimTrigger = Literal["scheduled", "manual"]
ReclaimOutcome = Literal["ok", "error"]


class ReclaimRunBase(SQLModel):
    """One reclaim sweep the control plane ran: when, why, how it ended, and what the engine's
    sweep did (``engine.kv_stats.ReclaimResult``'s fields by its names; the pool counts are
    None and the blocks 0 when it failed). Declared once for the table (``MaintenanceRun``)
    and the API's answer (``control.schemas.state.ReclaimRun``)."""

    at: datetime = timestamp_field(index=True)
    trigger: ReclaimTrigger = Field(sa_type=AutoString)
    outcome: ReclaimOutcome = Field(sa_type=AutoString)
    freed: int = 0
    evicted: int = 0
    free_before: int | None = None
    free_after: int | None = None
    reserve_breached: bool = False
    duration_s: float = 0.0
    error: str | None = None

    @classmethod
    def of(cls, result: ReclaimResult, at: datetime, trigger: ReclaimTrigger) -> Self:
        """A sweep that ran: the engine's figures as they are."""
        figures = {f.name: getattr(result, f.name) for f in dataclasses.fields(ReclaimResult)}
        return cls(at=at, trigger=trigger, outcome="ok", **figures)

    @classmethod
    def failed(
        cls, at: datetime, trigger: ReclaimTrigger, duration_s: float, error: BaseException
    ) -> Self:
        """A sweep the engine did not answer: no figures, and why."""
        return cls(
            at=at,
            trigger=trigger,
            outcome="error",
            duration_s=duration_s,
            error=f"{type(error).__name__}: {error}",
        )


class MaintenanceRun(ReclaimRunBase, table=True):
    """One row per maintenance run; only the newest ``maintenance_retention`` rows are kept."""

    __tablename__ = "maintenance_run"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)


class Schedule(SQLModel, table=True):
    """A policy window: from each cron firing until the next ``until`` wall time in ``timezone``.

    ``applied_version`` is the policy version that put the current window in force (None when
    none is); ``window_start`` the firing it belongs to. A deleted schedule keeps its row
    (``deleted_at`` set) so its audit stays readable."""

    __tablename__ = "schedule"

    id: int | None = Field(default=None, primary_key=True)
    cron: str
    cron_seconds: str | None = None
    until: str
    timezone: str
    policy_name: str
    policy_params: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    memory_reserve: float | None = None
    reason: str
    priority: int = 0
    actor: str
    created_at: datetime = timestamp_field(default_factory=utcnow)
    deleted_at: datetime | None = timestamp_field(default=None)
    window_start: datetime | None = timestamp_field(default=None)
    applied_version: int | None = None
    last_end_at: datetime | None = timestamp_field(default=None)
    last_end: str | None = Field(default=None, description="What the last window end did.")


class ScheduleChange(SQLModel, table=True):
    """One row per create or delete of a schedule: who, why, before and after."""

    __tablename__ = "schedule_change"

    id: int | None = Field(default=None, primary_key=True)
    schedule_id: int = Field(index=True)
    action: str
    actor: str
    reason: str
    before: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    after: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    at: datetime = timestamp_field(default_factory=utcnow)


class GuardrailSetting(SQLModel, table=True):
    """One row per stored guardrail config (``PUT /admin/guardrail``); the newest is in force.
    ``config`` is the whole ``GuardrailConfig`` document."""

    __tablename__ = "guardrail_setting"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = timestamp_field(default_factory=utcnow)
    actor: str
    reason: str
    config: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)


class GuardrailDecision(SQLModel, table=True):
    """One row per guardrail evaluation that proposed a change (``DecisionView``'s fields;
    settings, predictions and figures as JSON). ``observed_after`` and ``prediction_error``
    are filled once the interval after the decision has passed (``filled_at`` set then)."""

    __tablename__ = "guardrail_decision"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = timestamp_field(default_factory=utcnow, index=True)
    mode: str
    outcome: str
    reason: str
    current: dict[str, Any] = Field(sa_type=JSON)
    chosen: dict[str, Any] = Field(sa_type=JSON)
    predicted_current: dict[str, Any] = Field(sa_type=JSON)
    predicted: dict[str, Any] = Field(sa_type=JSON)
    candidates: list[dict[str, Any]] = Field(default_factory=list, sa_type=JSON)
    observed_before: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    correction: float
    trace_requests: int
    version: int | None = None
    interval_s: float = Field(description="The evaluation interval: observed_after spans it.")
    observed_after: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    prediction_error: dict[str, float] | None = Field(default=None, sa_type=JSON)
    filled_at: datetime | None = timestamp_field(default=None)
