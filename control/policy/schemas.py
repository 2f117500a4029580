"""The policy admin API's bodies: a version's settings (the typed spec, the queue, the reserve
and the sweep interval), the PUT and its dry-run prediction, history, rollback and the params
schema."""

from __future__ import annotations

from datetime import datetime
from types import EllipsisType
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    field_validator,
)

from control.core.config import MEMORY_RESERVE_BOUNDS, RECLAIM_INTERVAL_BOUNDS
from control.schemas.errors import AdminError, Responses
from engine.timeline import HeldShare
from policies.queue import FcfsQueue, QueueSpec
from policies.spec import PolicySpec
from sim.groups import GroupFigures

Source = Literal["default", "stored", "override"]


# These return Any as pydantic's Field does: the FieldInfo stands for the field's default.
def memory_reserve_field(default: float | EllipsisType | None = ...) -> Any:
    return Field(
        default,
        ge=MEMORY_RESERVE_BOUNDS[0],
        le=MEMORY_RESERVE_BOUNDS[1],
        description="Fraction of KV blocks that admission of new work may not take.",
    )


def reclaim_interval_field(default: float | EllipsisType | None = ...) -> Any:
    return Field(
        default,
        ge=RECLAIM_INTERVAL_BOUNDS[0],
        le=RECLAIM_INTERVAL_BOUNDS[1],
        description="Seconds between two runs of the KV reclaim sweep.",
    )


VersionState = Literal["pending", "applied", "failed"]


REASON_PATTERN = r"\S"
"""A reason holds at least one character that is not white space (JSON schema ``pattern``
matches anywhere in the string, as pydantic's does)."""


NOT_FOUND: Responses = {404: {"model": AdminError, "description": "No such policy version."}}


CONFLICT: Responses = {
    409: {"model": AdminError, "description": "If-Match names an older version."}
}


class VersionStatus(BaseModel):
    state: VersionState = Field(
        description="pending: stored, not yet in force (retried); applied; failed (see reason)."
    )
    state_reason: str | None = Field(None, description="Why it failed or is still pending.")
    state_at: datetime | None = Field(None, description="When the state was reached.")


class PolicySettings(BaseModel):
    """What a policy version holds."""

    policy: PolicySpec
    queue: QueueSpec = Field(
        default_factory=FcfsQueue,
        description="Whose request goes first, beside how requests are batched: fcfs, "
        "priority (a request's priority: lower first) or fair (share between tenants).",
    )
    memory_reserve: float = memory_reserve_field()
    reclaim_interval_s: float = reclaim_interval_field()


class PolicyView(BaseModel):
    version: int
    settings: PolicySettings
    effective_params: dict[str, Any] = Field(  # Any: the policy's own params, JSON
        description="The params in force, engine caps filled in for null defaults."
    )
    sources: dict[str, Source]
    actor: str
    reason: str
    created_at: datetime
    status: VersionStatus


class PolicyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: PolicySpec | None = Field(None, description="A full spec: its params replace all.")
    queue: QueueSpec | None = Field(None, description="Queue order (absent: kept as it is).")
    # Strict: a number (an integer is one), never a boolean or a numeric string.
    memory_reserve: StrictFloat | None = memory_reserve_field(None)
    reclaim_interval_s: StrictFloat | None = reclaim_interval_field(None)
    reason: str = Field(
        min_length=1, pattern=REASON_PATTERN, description="Why: required, not blank."
    )

    @field_validator("reason", mode="before")
    @classmethod
    def _reason_not_blank(cls, value: object) -> object:
        # Before the constraints, so a blank reason gets this message, not the pattern's.
        if isinstance(value, str) and not value.strip():
            raise ValueError("reason must not be empty: say why the policy changes")
        return value.strip() if isinstance(value, str) else value


class FieldChange(BaseModel):
    field: str
    before: Any  # Any: the setting's value, JSON (rows.flatten)
    after: Any


class SettingPrediction(BaseModel):
    """What the simulator predicts one setting does on the recorded trace."""

    output_tokens_per_s: float = Field(description="Predicted output tokens per second.")
    ttft_p50_s: float | None = Field(description="Predicted median time to first token.")
    ttft_p99_s: float | None = Field(description="Predicted 99th-percentile time to first token.")
    tpot_p50_s: float | None = Field(description="Predicted median time per output token.")
    tpot_p99_s: float | None = Field(
        None, description="Predicted 99th-percentile time per output token."
    )
    goodput_rps: float | None = Field(
        None, description="Predicted requests/s within the guardrail's objectives (when asked)."
    )
    requests: int = Field(description="Requests the simulation completed.")
    tenants: list[GroupFigures] = Field(
        default_factory=list,
        description="Per tenant (the most served first, the rest as 'other'): service share "
        "against its weight's share, TTFT and TPOT percentiles.",
    )
    priorities: list[GroupFigures] = Field(
        default_factory=list,
        description="Per priority class (lower is served earlier): service share, TTFT and "
        "TPOT percentiles.",
    )
    waits: list[HeldShare] = Field(
        default_factory=list,
        description="The simulated run's waiting seconds by what held the queue's head (the "
        "engine's reasons, docs/observability.md), the whole trace's; each reason's share is "
        "its seconds over their sum (empty: nothing waited).",
    )


class CalibrationUsed(BaseModel):
    """The calibration file a prediction's cost model is (``servedeck calibrate``'s)."""

    path: str = Field(description="The file, as the server read it.")
    created: str = Field(description="When it was made (ISO 8601, UTC).")
    source: Literal["explicit", "stored"] = Field(
        description="explicit: --cost-model FILE; stored: the server found it among the stored "
        "calibrations ($SERVEDECK_HOME/calibrations) as the one of its model, dtype, CPU kind "
        "and attention path."
    )


class Prediction(BaseModel):
    """A dry run's prediction, or why there is none (never a made-up figure)."""

    available: bool
    reason: str | None = Field(
        None,
        description="Why there is no prediction (when unavailable); 'uncalibrated: ...' where "
        "the server has no cost model.",
    )
    cost_model: str | None = Field(None, description="The cost model the prediction is from.")
    calibration: CalibrationUsed | None = Field(
        None,
        description="The calibration the cost model is (null for a roofline profile, or none).",
    )
    correction: float | None = Field(
        None,
        description="Every predicted step was scaled by this: the engine's recent step times "
        "÷ the cost model's prediction for the same steps (null: none seen yet, unscaled).",
    )
    calibrate_command: str | None = Field(
        None,
        description="Uncalibrated: the command that makes a calibration of the served model, "
        "dtype and CPU, which the server finds at its next start.",
    )
    trace_requests: int = Field(0, description="Recorded requests the prediction replayed.")
    statement: str = Field(description="What the figures are, in words.")
    current: SettingPrediction | None = Field(None, description="The setting in force now.")
    candidate: SettingPrediction | None = Field(None, description="The setting of the update.")


class PolicyUpdateResult(BaseModel):
    dry_run: bool
    applied: bool
    stored: bool = Field(
        description="Whether a new version was stored: false for a dry run and for a change "
        "whose effective settings equal the active ones (then `version` is the active one)."
    )
    version: int = Field(
        description="The version stored; for a dry run, the version it was checked against."
    )
    diff: list[FieldChange]
    settings: PolicySettings
    status: VersionStatus | None = Field(
        None, description="The stored version's state (null for a dry run)."
    )
    prediction: Prediction | None = Field(
        None,
        description="Dry runs only: the simulator's prediction of the current and the "
        "candidate setting on the recorded traffic, or why there is none.",
    )


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, description='Why; null, "" or blank: "rollback to version N".')


class PolicyVersionPublic(BaseModel):
    version: int
    settings: PolicySettings
    actor: str
    reason: str
    before: PolicySettings | None
    after: PolicySettings
    created_at: datetime
    rollback_of: int | None
    status: VersionStatus


class PolicyHistory(BaseModel):
    items: list[PolicyVersionPublic]
    total: int
    offset: int
    limit: int


class Bounds(BaseModel):
    minimum: float
    maximum: float


class EngineLimitsView(BaseModel):
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int


class PolicySchema(BaseModel):
    policies: dict[str, dict[str, Any]]  # Any: each policy's params JSON Schema
    memory_reserve: Bounds = Bounds(
        minimum=MEMORY_RESERVE_BOUNDS[0], maximum=MEMORY_RESERVE_BOUNDS[1]
    )
    reclaim_interval_s: Bounds = Bounds(
        minimum=RECLAIM_INTERVAL_BOUNDS[0], maximum=RECLAIM_INTERVAL_BOUNDS[1]
    )
    engine_limits: EngineLimitsView
