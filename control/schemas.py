"""Request and response bodies of docs/api.md (so ``/openapi.json`` is exact)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializeAsAny,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic_core import PydanticCustomError

from control.core.config import MEMORY_RESERVE_BOUNDS, RECLAIM_INTERVAL_BOUNDS
from control.models import ReclaimRunBase
from control.openai_fields import JsonInt, UnsupportedFields, _json_integer
from control.schedules import TIMEZONE_MAX_LENGTH, check_fires, cron_trigger, wall_time, zone
from engine.kv_stats import KVStats
from engine.sampling_params import MAX_LOGPROBS, MAX_N
from engine.snapshot import Latency, QueueDepths, RequestSnapshot, Throughput, Totals
from policies.base import PolicySnapshot
from policies.queue import FcfsQueue, QueueSpec
from policies.spec import PolicySpec

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

SEED_BOUNDS = (-(2**53), 2**53)
"""Integers a JSON number holds exactly (so the bounds in ``/openapi.json``, written as
floats, are exact too); ``torch.Generator.manual_seed`` takes all of them."""


def _valid_unicode(value: str, field: str) -> str:
    """JSON can carry a lone surrogate (``"a\\ud800b"``) that no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field} is not valid Unicode: a lone surrogate at index {exc.start}"
        ) from None
    return value


class StreamOptions(BaseModel):
    include_usage: StrictBool = Field(
        False, description="A last chunk, with no choices, carries the request's usage."
    )
    continuous_usage_stats: StrictBool = Field(
        False,
        description="vLLM's extension, with include_usage: every chunk also carries its "
        "choice's usage so far (load testers such as guidellm ask for it).",
    )


TextPrompt = Annotated[StrictStr, Field(min_length=1)]
TokenId = Annotated[StrictInt, Field(ge=0), BeforeValidator(_json_integer)]
"""A ``JsonInt`` >= 0 (the bound before the validator, so the JSON schema says ``minimum``)."""
TokenPrompt = Annotated[list[TokenId], Field(min_length=1)]
Seed = Annotated[
    StrictInt, Field(ge=SEED_BOUNDS[0], le=SEED_BOUNDS[1]), BeforeValidator(_json_integer)
]
StopString = Annotated[StrictStr, Field(min_length=1)]
LogprobsCount = Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(_json_integer)]
"""How many most likely tokens to list per token (the bound before the validator, so the JSON
schema says ``minimum``/``maximum`` inside the nullable field)."""


class CompletionRequest(UnsupportedFields):
    """Types are strict where OpenAI's schema is (no ``"yes"`` for a boolean, no ``true`` for
    a token id); numbers may be written as integers. Limits that depend on the server's
    settings (stop list size, prompt length) are checked by the route and answer 400; the
    stop list's are written into ``/openapi.json`` from the settings
    (``control.api.limits.document_stop_limits``). Fields accepted only at their default
    (``best_of``, penalties, ``logit_bias``, ...) come from ``UnsupportedFields``."""

    model: StrictStr | None = None
    prompt: TextPrompt | TokenPrompt = Field(description="Text, or token ids (not empty).")
    max_tokens: JsonInt = Field(
        16, ge=1, description="Prompt tokens + max_tokens must fit max_model_len."
    )
    temperature: StrictFloat = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: JsonInt = Field(0, ge=-1, description="0 or -1: no top-k cut.")
    seed: Seed | None = Field(
        None, description="The request's own random generator; |seed| <= 2**53."
    )
    stop: StopString | list[StopString] | None = Field(
        None,
        description="Non-empty strings: at most max_stop_strings of them, each at most "
        "max_stop_length characters (server settings).",
    )
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = Field(False, description="Extension: keep generating past EOS.")
    n: JsonInt = Field(
        1,
        ge=1,
        le=MAX_N,
        description="Choices to generate; they share the prompt's KV blocks (computed once). "
        "With a seed, choice i samples with seed + i.",
    )
    logprobs: LogprobsCount | None = Field(
        None,
        description="Log-probabilities of each token and of the N most likely ones (plus the "
        "chosen one), from the model's raw distribution (before temperature, top-k, top-p).",
    )
    echo: StrictBool = Field(
        False,
        description="Prepend the prompt to each choice's text (with logprobs: and its tokens' "
        "logprobs, the first token's null).",
    )
    suffix: StrictStr | None = Field(
        None,
        description='Only "" (or null) is accepted: insertion is not supported.',
        json_schema_extra={"maxLength": 0},
    )

    @field_validator("model")
    @classmethod
    def _model_unicode(cls, value: str | None) -> str | None:
        return None if value is None else _valid_unicode(value, "model")

    @field_validator("prompt")
    @classmethod
    def _prompt_unicode(cls, value: str | list[int]) -> str | list[int]:
        return _valid_unicode(value, "prompt") if isinstance(value, str) else value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise PydanticCustomError(
                "unsupported_value", 'suffix is not supported: only "" is accepted'
            )
        return value

    @field_validator("stop")
    @classmethod
    def _stops_as_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        for stop in stops:
            _valid_unicode(stop, "stop")
        return stops


class ErrorInfo(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error.")
    param: str | None = Field(None, description="The request field at fault, if one is.")
    code: str | None = Field(None, description="A stable name for the refusal, if one fits.")


class ErrorResponse(BaseModel):
    """OpenAI's error body: every refusal and failure on ``/v1`` answers with it."""

    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions logprobs, one entry per token of the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] = Field(
        description="Per token: the N most likely tokens' log-probabilities, most likely "
        "first, plus the chosen token's."
    )
    text_offset: list[int] = Field(description="Where each token's text starts.")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
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
    """What vLLM's ``/v1/models`` gives for a model (``permission`` is always empty)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "servedeck"
    root: str | None = Field(
        None, description="What the model is served as (vLLM: its checkpoint)."
    )
    parent: str | None = None
    max_model_len: int | None = Field(None, description="Prompt + output tokens, at most.")
    permission: list[dict[str, Any]] = Field(default_factory=list)


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


NotReadyReason = Literal["loading", "failed", "draining", "stalled"]


class Ready(BaseModel):
    status: Literal["ready"] = "ready"


class NotReady(BaseModel):
    """``GET /ready`` while the server should get no new traffic."""

    status: Literal["not_ready"] = "not_ready"
    reason: NotReadyReason
    detail: str = Field(description="What the reason means right now, for a person.")


# -- policy ----------------------------------------------------------------------------------

VersionState = Literal["pending", "applied", "failed"]
REASON_PATTERN = r"\S"
"""A reason holds at least one character that is not white space (JSON schema ``pattern``
matches anywhere in the string, as pydantic's does)."""


class AdminError(BaseModel):
    """Every admin refusal but 422: ``{"detail": "message"}``."""

    detail: str


ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": AdminError, "description": "No bearer token (WWW-Authenticate: Bearer)."},
    403: {"model": AdminError, "description": "The bearer token is not this server's."},
    503: {
        "model": AdminError,
        "description": "Loading, shutting down, the engine is slow, or the store refused a "
        "write (`store unavailable: ` and SQLite's reason, e.g. `database or disk is full`).",
    },
}
"""What every admin route may answer besides its own codes (422 FastAPI declares itself)."""
NOT_FOUND = {404: {"model": AdminError, "description": "No such policy version."}}
CONFLICT = {409: {"model": AdminError, "description": "If-Match names an older version."}}
BAD_BODY = {400: {"model": AdminError, "description": "The body is not valid JSON."}}


class StoreUnavailableError(AdminError):
    """A 503 of a policy change: ``detail`` names the cause; when the store refused the
    version's state after storing it, ``stored`` is true with the ``version`` and its
    ``state`` as it reads now (``pending``: the reconcile job records it once it can)."""

    stored: bool = Field(False, description="Whether a new version was stored.")
    version: int | None = Field(None, description="The version stored, if one was.")
    state: Literal["pending"] | None = Field(
        None, description="The stored version's state in the store (its state write failed)."
    )
    in_force: bool | None = Field(None, description="Whether the engine runs that version.")


STORE_UNAVAILABLE = {
    503: {
        "model": StoreUnavailableError,
        "description": "Loading, shutting down, the engine is slow, or the store refused a "
        "write: `detail` names the cause; `stored` says whether the version was stored "
        "(then it is `pending` until the reconcile job records its state).",
    }
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
        description="Queue order beside the batching policy (only fcfs yet; the engine does "
        "not read it: fcfs is what every policy does).",
    )
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
    def _reason_not_blank(cls, value: Any) -> Any:
        # Before the constraints, so a blank reason gets this message, not the pattern's.
        if isinstance(value, str) and not value.strip():
            raise ValueError("reason must not be empty: say why the policy changes")
        return value.strip() if isinstance(value, str) else value


class FieldChange(BaseModel):
    field: str
    before: Any
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


class Prediction(BaseModel):
    """A dry run's prediction, or why there is none (never a made-up figure)."""

    available: bool
    reason: str | None = Field(None, description="Why there is no prediction (when unavailable).")
    cost_model: str | None = Field(None, description="The cost model the prediction is from.")
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
    policies: dict[str, dict[str, Any]]
    memory_reserve: Bounds = Bounds(
        minimum=MEMORY_RESERVE_BOUNDS[0], maximum=MEMORY_RESERVE_BOUNDS[1]
    )
    reclaim_interval_s: Bounds = Bounds(
        minimum=RECLAIM_INTERVAL_BOUNDS[0], maximum=RECLAIM_INTERVAL_BOUNDS[1]
    )
    engine_limits: EngineLimitsView


# -- state and maintenance ---------------------------------------------------------------------


class ReclaimRun(ReclaimRunBase):
    """A recorded reclaim sweep: when, why, how it ended and what it did."""


class JobView(BaseModel):
    id: str
    interval_s: float
    next_run_at: datetime | None
    on_time: bool
    last_runs: list[ReclaimRun]


class JobsView(BaseModel):
    jobs: list[JobView]


SchedulerState = PolicySnapshot
"""The policy's own snapshot (policies/base.py; each policy's subclass adds its fields)."""
RequestRow = RequestSnapshot
KVState = KVStats
"""The KV accounting, defined once by the engine (engine/kv_stats.py). Queue depths,
throughput, latency and totals are the engine snapshot's own models too."""


class AdminState(BaseModel):
    """``/admin/state``: the engine's snapshot (engine/snapshot.py), read by attribute, with
    the control plane's version and its recorded reclaim sweeps."""

    version: int
    policy: PolicySpec
    policy_version: int | None = Field(
        None, description="The policy version the engine reports it runs (set with the policy)."
    )
    scheduler: SerializeAsAny[SchedulerState]
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


class StallResult(BaseModel):
    """Test-only: the engine loop is blocked for ``seconds`` from ``at``."""

    seconds: float
    at: datetime


class StorePages(BaseModel):
    """Test-only: the SQLite file's pages, and the cap every new connection gets (None: off)."""

    page_size: int
    page_count: int
    freelist_count: int = Field(description="Free pages a write uses before growing the file.")
    max_page_count: int | None = Field(description="A write needing more pages is refused.")


class ScheduleCreate(BaseModel):
    """A policy window: from each ``cron`` firing (in ``timezone``) until the next ``until``
    wall time there. Overlapping windows: the higher ``priority`` wins, then the latest start."""

    model_config = ConfigDict(extra="forbid")

    cron: StrictStr = Field(
        description="Crontab (5 fields: minute hour day month weekday) that fires within the "
        "next five years."
    )
    cron_seconds: StrictStr | None = Field(
        None, description="Optional cron seconds field (e.g. `30`, `*/10`); crontab has none."
    )
    until: StrictStr = Field(description="Local wall time HH:MM[:SS] the window ends at.")
    timezone: StrictStr = Field(
        "UTC", max_length=TIMEZONE_MAX_LENGTH, description="IANA zone of cron and until."
    )
    policy: PolicySpec
    memory_reserve: StrictFloat | None = memory_reserve_field(None)
    reason: str = Field(min_length=1, pattern=REASON_PATTERN, description="Why: required.")
    priority: JsonInt = Field(0, ge=-1000, le=1000, description="Higher wins an overlap.")

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        cron_trigger(value, "UTC")
        check_fires(value)  # 30 February: refused here, never searched for on every tick
        return value

    @field_validator("cron_seconds")
    @classmethod
    def _cron_seconds(cls, value: str | None) -> str | None:
        if value is not None:
            cron_trigger("* * * * *", "UTC", value)
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("until")
    @classmethod
    def _until(cls, value: str) -> str:
        wall_time(value)
        return value


class ScheduleChangeView(BaseModel):
    action: Literal["create", "delete"]
    actor: str
    reason: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    at: datetime


class ScheduleView(BaseModel):
    id: int
    cron: str
    cron_seconds: str | None
    until: str
    timezone: str
    policy: PolicySpec
    memory_reserve: float | None
    reason: str
    priority: int
    actor: str
    created_at: datetime
    next_run_at: datetime | None = Field(description="The next firing (UTC).")
    active: bool = Field(description="Its window is the one in force now.")
    window_start: datetime | None = Field(description="Start of the window it last applied.")
    applied_version: int | None = Field(description="The version that applied that window.")
    last_end_at: datetime | None
    last_end: str | None = Field(description="What the last end did: restored, or kept.")


class ScheduleDetail(ScheduleView):
    next_firings: list[datetime] = Field(description="The next firings (UTC), with their ends.")
    next_ends: list[datetime]
    changes: list[ScheduleChangeView]


class ScheduleList(BaseModel):
    items: list[ScheduleView]
    active: int | None = Field(description="Id of the schedule whose window is in force.")


class DemoLoadView(BaseModel):
    """The demo load a server sends itself (``servedeck serve --demo-load R``)."""

    enabled: bool = Field(description="Whether the server was started with --demo-load.")
    rate: float = Field(0.0, description="Requests per second now (0: paused).")
    start_rate: float = Field(0.0, description="The rate it was started with (--demo-load).")
    sent: int = 0
    completed: int = 0
    failed: int = 0
    running: bool = Field(False, description="Whether its thread is alive.")


DEMO_LOAD_MAX_RATE = 100.0


class DemoLoadUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rate: StrictFloat = Field(
        ge=0, le=DEMO_LOAD_MAX_RATE, description="Requests per second; 0 pauses."
    )
