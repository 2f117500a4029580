"""Request and response bodies of docs/api.md (so ``/openapi.json`` is exact)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from control.core.config import MEMORY_RESERVE_BOUNDS, RECLAIM_INTERVAL_BOUNDS
from policies.base import PolicySpec

Source = Literal["default", "stored", "override"]


def memory_reserve_field(default: Any = ...) -> Any:
    return Field(
        default,
        ge=MEMORY_RESERVE_BOUNDS[0],
        le=MEMORY_RESERVE_BOUNDS[1],
        description="Fraction of KV blocks that admission of new work may not take.",
    )


def reclaim_interval_field(default: Any = ...) -> Any:
    return Field(
        default,
        ge=RECLAIM_INTERVAL_BOUNDS[0],
        le=RECLAIM_INTERVAL_BOUNDS[1],
        description="Seconds between two runs of the KV reclaim sweep.",
    )


# -- public API ------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str | list[int] = Field(description="Text, or token ids.")
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1: no top-k cut.")
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="Extension: keep generating past EOS.")
    n: int = Field(1, ge=1, le=1, description="Only one choice per request is supported.")

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str | list[int]) -> str | list[int]:
        if len(value) == 0:
            raise ValueError("prompt must not be empty")
        return value

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None
    stop_reason: str | int | None = Field(
        None, description="Extension: the stop string or token id that ended the text."
    )


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "servedeck"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    policy: str
    version: int
    reclaim_job_on_time: bool


class HealthLoading(BaseModel):
    status: Literal["loading", "failed"] = "loading"


# -- policy ----------------------------------------------------------------------------------


class PolicySettings(BaseModel):
    """What a policy version holds."""

    policy: PolicySpec
    memory_reserve: float = memory_reserve_field()
    reclaim_interval_s: float = reclaim_interval_field()


class PolicyView(BaseModel):
    version: int
    settings: PolicySettings
    effective_params: dict[str, Any] = Field(
        description="The params in force, engine caps filled in for null defaults."
    )
    sources: dict[str, Source]
    actor: str
    reason: str
    created_at: datetime


class PolicyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: PolicySpec | None = Field(None, description="A full spec: its params replace all.")
    memory_reserve: float | None = memory_reserve_field(None)
    reclaim_interval_s: float | None = reclaim_interval_field(None)
    reason: str = Field(description="Why: required, non-empty.")

    @field_validator("reason")
    @classmethod
    def _reason_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("reason must not be empty: say why the policy changes")
        return value.strip()


class FieldChange(BaseModel):
    field: str
    before: Any
    after: Any


class PolicyUpdateResult(BaseModel):
    dry_run: bool
    applied: bool
    version: int = Field(
        description="The version stored; for a dry run, the version it was checked against."
    )
    diff: list[FieldChange]
    settings: PolicySettings


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = None


class PolicyVersionPublic(BaseModel):
    version: int
    settings: PolicySettings
    actor: str
    reason: str
    before: PolicySettings | None
    after: PolicySettings
    created_at: datetime
    rollback_of: int | None


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
    policies: dict[str, dict[str, Any]]
    memory_reserve: Bounds = Bounds(
        minimum=MEMORY_RESERVE_BOUNDS[0], maximum=MEMORY_RESERVE_BOUNDS[1]
    )
    reclaim_interval_s: Bounds = Bounds(
        minimum=RECLAIM_INTERVAL_BOUNDS[0], maximum=RECLAIM_INTERVAL_BOUNDS[1]
    )
    engine_limits: EngineLimitsView


# -- state and maintenance ---------------------------------------------------------------------


class ReclaimRun(BaseModel):
    at: datetime
    trigger: Literal["scheduled", "manual"]
    outcome: Literal["ok", "error"]
    freed: int = 0
    evicted: int = 0
    free_before: int | None = None
    free_after: int | None = None
    reserve_breached: bool = False
    duration_s: float = 0.0
    error: str | None = None


class JobView(BaseModel):
    id: str
    interval_s: float
    next_run_at: datetime | None
    on_time: bool
    last_runs: list[ReclaimRun]


class JobsView(BaseModel):
    jobs: list[JobView]


class SchedulerState(BaseModel):
    model_config = ConfigDict(extra="allow")

    policy: str
    params: dict[str, Any]
    waiting: int
    running: int
    preemptions: int
    mode: str | None = None


class QueueDepths(BaseModel):
    waiting: int
    running: int


class RequestRow(BaseModel):
    id: str
    state: str
    prompt_tokens: int
    generated_tokens: int
    blocks: int
    age_s: float
    preemptions: int


class KVState(BaseModel):
    block_size: int
    total: int
    free: int
    used: int
    cached: int
    reserved: int
    live_tokens: int
    held_slots: int
    utilization: float
    usage: float


class Throughput(BaseModel):
    output_tokens_per_s: float
    prompt_tokens_per_s: float
    steps_per_s: float


class Percentiles(BaseModel):
    p50: float | None
    p95: float | None
    p99: float | None


class Latency(BaseModel):
    ttft: Percentiles
    tpot: Percentiles
    e2e: Percentiles


class Totals(BaseModel):
    steps: int
    prompt_tokens: int
    generation_tokens: int
    padded_tokens: int
    preemptions: int
    requests_finished: int
    engine_overhead: float


class AdminState(BaseModel):
    version: int
    policy: PolicySpec
    scheduler: SchedulerState
    memory_reserve: float
    uptime_s: float
    queue: QueueDepths
    requests: list[RequestRow]
    kv: KVState
    block_map: str = Field(description="One character per block: '.' free, '#' used, 'c' cached.")
    throughput: Throughput
    latency: Latency
    totals: Totals
    recent_reclaims: list[ReclaimRun]


class LeakResult(BaseModel):
    """Test-only: a request dropped without freeing its blocks."""

    request_id: str
    leaked: bool
    blocks: int = Field(description="Blocks the request held just before it was dropped.")
    at: datetime
