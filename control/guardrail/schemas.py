"""The guardrail's request and response bodies (docs/api.md, ``/admin/guardrail``).

The config is one document: the mode (``off`` is the kill switch, ``shadow`` records only,
``on`` applies), the objectives, and per knob the bounds within which the guardrail may move it.
A knob without bounds is never moved. Each PUT stores the whole document as a new audited row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, model_validator

from control.api.openai_fields import JsonInt
from control.core.config import MEMORY_RESERVE_BOUNDS
from control.policy.schemas import REASON_PATTERN, PolicySettings, SettingPrediction
from engine.tenants import MAX_PRIORITY, MIN_PRIORITY
from policies.base import PolicyName
from policies.json_types import json_typed

GuardrailMode = Literal["off", "shadow", "on"]
Outcome = Literal["applied", "shadow", "rate_limited", "window_active", "conflict", "failed"]
"""What became of a proposed change: applied as a version; recorded only (shadow mode);
held back by the rate limit; held back because a schedule window is in force (a window wins);
lost a race with another writer (retried next evaluation); refused by the store or engine."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IntRange(_Strict):
    min: JsonInt = Field(ge=1, le=1 << 20)
    max: JsonInt = Field(ge=1, le=1 << 20)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class FloatRange(_Strict):
    min: StrictFloat = Field(gt=0, le=86400)
    max: StrictFloat = Field(gt=0, le=86400)

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class ReserveRange(_Strict):
    min: StrictFloat = Field(ge=MEMORY_RESERVE_BOUNDS[0], le=MEMORY_RESERVE_BOUNDS[1])
    max: StrictFloat = Field(ge=MEMORY_RESERVE_BOUNDS[0], le=MEMORY_RESERVE_BOUNDS[1])

    @model_validator(mode="after")
    def _ordered(self) -> ReserveRange:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class KnobBounds(_Strict):
    """Where the guardrail may move each knob; ``null`` leaves that knob as it is."""

    policies: list[PolicyName] = Field(
        default_factory=lambda: list[PolicyName](["continuous", "hybrid"]),
        min_length=1,
        description="Policies it may choose (the knobs below apply where a policy has them).",
    )
    max_num_seqs: IntRange | None = Field(None, description="e.g. 16-256 (≤ the engine cap).")
    max_num_batched_tokens: IntRange | None = Field(None, description="The step's token budget.")
    max_prefill_tokens: IntRange | None = Field(
        None, description="Prefill tokens a step carries beside decodes (≤ the step budget cap)."
    )
    single_request_below: IntRange | None = Field(None, description="Hybrid's threshold, 1-8.")
    max_wait_s: FloatRange | None = Field(None, description="The aging bound, seconds.")
    memory_reserve: ReserveRange | None = Field(None, description="e.g. 0.10-0.15.")


PriorityClass = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY), json_typed("integer")]
"""A request priority (the bounds before the JSON type check, so that the schema states them
inside the optional field's ``anyOf``)."""


class Objectives(_Strict):
    """What the guardrail keeps; at least one is set."""

    ttft_p99_s: StrictFloat | None = Field(None, gt=0, le=3600, description="TTFT p99 bound.")
    tpot_p99_s: StrictFloat | None = Field(None, gt=0, le=3600, description="TPOT p99 bound.")
    goodput_min_rps: StrictFloat | None = Field(
        None,
        gt=0,
        le=1e6,
        description="Floor on requests per second that finish within the latency objectives.",
    )
    priority: PriorityClass | None = Field(
        None,
        description=(
            "Judge only requests of this priority class (a request's priority: lower is served "
            "earlier), e.g. 0 for the interactive class; absent: every request."
        ),
    )

    def judged(self, priority: int) -> bool:
        """Whether a request of this priority counts towards the objectives."""
        return self.priority is None or priority == self.priority

    @model_validator(mode="after")
    def _some(self) -> Objectives:
        if self.ttft_p99_s is None and self.tpot_p99_s is None and self.goodput_min_rps is None:
            raise ValueError("set at least one objective")
        return self


class GuardrailConfig(_Strict):
    mode: GuardrailMode = Field("off", description="off (kill switch), shadow, on.")
    objectives: Objectives = Field(default_factory=lambda: Objectives(ttft_p99_s=2.0))
    bounds: KnobBounds = Field(default_factory=KnobBounds)
    interval_s: StrictFloat = Field(
        30.0, ge=1, le=86400, description="Seconds between two evaluations."
    )
    window_s: StrictFloat = Field(
        60.0, ge=1, le=86400, description="Observed figures are over the last this many seconds."
    )
    min_change_interval_s: StrictFloat = Field(
        120.0, ge=0, le=86400, description="Rate limit: at most one change per this interval."
    )
    hysteresis: StrictFloat = Field(
        0.1,
        ge=0,
        le=10,
        description="A change must beat the setting in force by this fraction (throughput "
        "when both meet the objectives, margin otherwise).",
    )
    max_candidates: JsonInt = Field(16, ge=1, le=64, description="Settings simulated each time.")


class GuardrailUpdate(GuardrailConfig):
    reason: str = Field(min_length=1, pattern=REASON_PATTERN, description="Why: required.")


class ObservedFigures(BaseModel):
    """Measured over a window of finished requests (never simulated)."""

    since: datetime
    until: datetime
    requests: int
    output_tokens_per_s: float
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    goodput_rps: float | None = Field(None, description="Requests/s within the objectives.")


class GuardrailStatus(BaseModel):
    active: bool = Field(description="Whether evaluations run (mode shadow/on and able to).")
    reason: str | None = Field(None, description="Why not, when not (e.g. no cost model).")
    cost_model: str | None
    correction: float | None = Field(
        None, description="The cost model's correction, observed ÷ predicted step time."
    )
    margin: float | None = Field(
        None, description="Observed: min over objectives of (objective - figure) / objective."
    )
    observed: ObservedFigures | None = None
    last_evaluation_at: datetime | None = None
    last_change_at: datetime | None = None
    window_active: int | None = Field(None, description="A schedule window in force (wins).")


class GuardrailView(BaseModel):
    config: GuardrailConfig
    revision: int = Field(description="The stored config row (0: the defaults, never stored).")
    actor: str | None
    reason: str | None
    updated_at: datetime | None
    status: GuardrailStatus


class Candidate(BaseModel):
    settings: PolicySettings
    prediction: SettingPrediction
    meets: bool = Field(description="Predicted to meet every objective.")
    margin: float = Field(description="Predicted margin (see GuardrailStatus.margin).")


class DecisionView(BaseModel):
    id: int
    at: datetime
    mode: GuardrailMode
    outcome: Outcome
    reason: str = Field(description="Why this outcome; for a change it quotes the prediction.")
    current: PolicySettings
    chosen: PolicySettings
    predicted_current: SettingPrediction
    predicted: SettingPrediction
    candidates: list[Candidate]
    observed_before: ObservedFigures | None
    correction: float
    trace_requests: int
    version: int | None = Field(description="The version stored (outcome applied).")
    observed_after: ObservedFigures | None = Field(
        description="Measured over the interval after the decision (filled in later)."
    )
    prediction_error: dict[str, float] | None = Field(
        description="observed_after ÷ predicted per figure (1.0 is exact)."
    )


class DecisionList(BaseModel):
    items: list[DecisionView]
