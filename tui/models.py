"""The REST shapes of docs/api.md as the console reads them.

Lenient on purpose: unknown fields are kept, missing optional ones default, so a newer server
does not break an older console.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class PolicySpec(Model):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class PolicySettings(Model):
    policy: PolicySpec
    memory_reserve: float
    reclaim_interval_s: float


class PolicyView(Model):
    version: int
    settings: PolicySettings
    effective_params: dict[str, Any] = Field(default_factory=dict)
    sources: dict[str, str] = Field(default_factory=dict)
    actor: str | None = None
    reason: str | None = None
    created_at: str | None = None
    etag: str | None = None
    """The ETag header of the response (``"N"``), sent back as ``If-Match``."""


class FieldChange(Model):
    field: str
    before: Any = None
    after: Any = None


class PolicyUpdateResult(Model):
    dry_run: bool
    applied: bool
    version: int | None = None
    diff: list[FieldChange] = Field(default_factory=list)
    settings: PolicySettings | None = None


class VersionStatus(Model):
    state: str = "applied"
    state_reason: str | None = None
    state_at: str | None = None


class PolicyVersion(Model):
    version: int
    settings: PolicySettings
    actor: str | None = None
    reason: str | None = None
    before: PolicySettings | None = None
    after: PolicySettings | None = None
    created_at: str | None = None
    rollback_of: int | None = None
    status: VersionStatus | None = None
    """pending (stored, not yet in force), applied or failed; absent from older servers."""


class HistoryPage(Model):
    items: list[PolicyVersion] = Field(default_factory=list)
    total: int = 0
    offset: int = 0
    limit: int = 20


class Bounds(Model):
    minimum: float | None = None
    maximum: float | None = None


class PolicySchema(Model):
    policies: dict[str, dict[str, Any]]
    memory_reserve: Bounds = Field(default_factory=Bounds)
    reclaim_interval_s: Bounds = Field(default_factory=Bounds)
    engine_limits: dict[str, Any] = Field(default_factory=dict)


class QueueDepths(Model):
    waiting: int = 0
    running: int = 0


# -- why requests wait (issue 41; docs/observability.md) ------------------------------------
# Reasons, phases and event kinds are plain strings, not enums: a newer server's new reason
# is shown as it is named instead of failing the whole state.


class Hold(Model):
    """A constraint that held a request at a step: its reason and the figures that make it
    concrete (``{"left", "budget", "needed"}``, ``{"needed", "free", "reserve"}``,
    ``{"running", "cap"}`` or null; kept as sent: ``tui.waits.figures_text`` reads them)."""

    reason: str
    figures: Any = None


class WaitNow(Model):
    """``requests[].wait``: why a waiting request waits now (its own reason, or
    ``behind_queue`` with the head's hold), ``ahead`` of it, seconds in this wait."""

    reason: str
    hold: Hold | None = None
    ahead: int | None = None
    seconds: float = 0.0


class HeldShare(Model):
    """Seconds of waiting attributed to what held the queue's head."""

    reason: str
    seconds: float = 0.0


class HeadHold(Model):
    seq_id: str
    hold: Hold


class WaitSummary(Model):
    """``/admin/state``'s ``waits``: seconds by reason over the last ``window_s`` and since
    the start, what holds the head now, and the tail (the waiting of the requests whose TTFT
    was at or over the window's p99, ``tail_ttft_s``)."""

    window_s: float = 60.0
    recent: list[HeldShare] = Field(default_factory=list)
    total: list[HeldShare] = Field(default_factory=list)
    head: HeadHold | None = None
    tail_ttft_s: float | None = None
    tail: list[HeldShare] = Field(default_factory=list)


class Segment(Model):
    """A stretch of a request's life (``waiting``, ``prefill``, ``decode``; ``end`` null while
    it lasts), on the engine's clock."""

    phase: str
    start: float
    end: float | None = None
    reason: str | None = None
    first: Hold | None = None
    last: Hold | None = None
    ahead: int | None = None
    held_by: list[HeldShare] = Field(default_factory=list)
    chunks: list[int] = Field(default_factory=list)
    resumed: bool = False


class TimelineEvent(Model):
    kind: str
    time: float
    cause: str | None = None
    finish_reason: str | None = None
    policy: str | None = None


class RequestTimeline(Model):
    """``GET /admin/requests/{id}/timeline``: segments from arrival to the end, the events
    between them, the forks of an ``n`` > 1 request (no text: no ``--expose-text``)."""

    seq_id: str
    request_id: str = ""
    arrival_time: float = 0.0
    segments: list[Segment] = Field(default_factory=list)
    events: list[TimelineEvent] = Field(default_factory=list)
    finished: bool = False
    forks: list[RequestTimeline] = Field(default_factory=list)


class RequestInfo(Model):
    id: str
    state: str
    prompt_tokens: int = 0
    generated_tokens: int = 0
    blocks: int = 0
    age_s: float = 0.0
    preemptions: int = 0
    tenant: str = "default"
    priority: int = 0
    """The request's own priority: lower is served earlier (under the priority queue)."""
    wait: WaitNow | None = None
    """Why it waits now (a waiting request on a server that says; None otherwise)."""
    constrained: bool = False
    """A grammar constrains its output (response_format, structured_outputs, tools); False
    from a server older than issue 28."""


class RequestText(Model):
    """``GET /admin/requests/{id}``: one sequence's prompt and output as the server keeps them
    (a server started with ``--expose-text``)."""

    id: str
    request_id: str = ""
    state: str = "running"
    prompt: str = ""
    prompt_chars: int = 0
    prompt_truncated: bool = False
    output: str = ""
    output_chars: int = 0
    output_truncated: bool = False
    max_chars: int = 0
    finish_reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class KvStats(Model):
    block_size: int = 16
    total: int = 0
    free: int = 0
    used: int = 0
    cached: int = 0
    reserved: int = 0
    live_tokens: int = 0
    held_slots: int = 0
    utilization: float = 0.0
    usage: float = 0.0


class Throughput(Model):
    output_tokens_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    steps_per_s: float = 0.0


class Percentiles(Model):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None


class Latency(Model):
    ttft: Percentiles = Field(default_factory=Percentiles)
    tpot: Percentiles = Field(default_factory=Percentiles)
    e2e: Percentiles = Field(default_factory=Percentiles)


class DemoLoadView(Model):
    """``GET|PUT /admin/demo-load``."""

    enabled: bool = False
    rate: float = 0.0
    start_rate: float = 0.0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    running: bool = False


class ReplicaReclaim(Model):
    """A replica's last reclaim sweep (no timestamp: the sweep runs on the fleet's schedule)."""

    freed: int = 0
    evicted: int = 0
    free_before: int | None = None
    free_after: int | None = None
    reserve_breached: bool = False
    duration_s: float | None = None


class ReclaimRun(ReplicaReclaim):
    """A recorded sweep of the control plane's: the figures, and when, why and how it ended."""

    at: str | None = None
    trigger: str = "scheduled"
    outcome: str = "ok"
    error: str | None = None


class ReplicaView(Model):
    """One engine replica of a fleet (``servedeck serve --replicas N``)."""

    replica: str
    up: bool = True
    error: str | None = None
    pid: int | None = None
    version: int | None = None
    policy: str | None = None
    started_at: float | None = None
    waiting: int = 0
    running: int = 0
    in_flight: int = 0
    free_blocks: int = 0
    kv: KvStats | None = None
    generation_tokens: int = 0
    last_reclaim: ReplicaReclaim | None = None
    draining: bool | None = None
    """Being drained before a restart or upgrade (absent from servers that do not drain)."""


class ReplicaTotals(Model):
    replicas: int = 0
    up: int = 0
    waiting: int = 0
    running: int = 0
    free_blocks: int = 0
    kv_total: int = 0
    kv_used: int = 0
    kv_cached: int = 0
    generation_tokens: int = 0
    versions: list[int] = Field(default_factory=list)


class FleetRestart(Model):
    """A rolling restart of the fleet (``/admin/state`` → ``restart``; newer servers only)."""

    state: str = "running"
    replicas: list[str] = Field(default_factory=list)
    left: list[str] = Field(default_factory=list)
    started: list[str] = Field(default_factory=list)
    draining: str | None = None
    """The replica finishing its requests now."""
    error: str | None = None


class TenantInfo(Model):
    """One tenant in ``/admin/state.tenants``: its service so far and its requests now."""

    name: str
    weight: float = 1.0
    counter: float = 0.0
    service: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    waiting: int = 0
    running: int = 0
    refused: int = 0


class QueueOrder(Model):
    """The queue discipline in force (its params ride along as extra fields)."""

    name: str = "fcfs"


class AdminState(Model):
    version: int
    policy: PolicySpec
    queue_order: QueueOrder = Field(default_factory=QueueOrder)
    tenants: list[TenantInfo] = Field(default_factory=list)
    scheduler: dict[str, Any] = Field(default_factory=dict)
    memory_reserve: float = 0.0
    uptime_s: float = 0.0
    queue: QueueDepths = Field(default_factory=QueueDepths)
    requests: list[RequestInfo] = Field(default_factory=list)
    kv: KvStats = Field(default_factory=KvStats)
    block_map: str = ""
    throughput: Throughput = Field(default_factory=Throughput)
    latency: Latency = Field(default_factory=Latency)
    totals: dict[str, Any] = Field(default_factory=dict)
    recent_reclaims: list[ReclaimRun] = Field(default_factory=list)
    replicas: list[ReplicaView] = Field(default_factory=list)
    """Each engine replica with ``--replicas``; empty without a fleet."""
    replica_totals: ReplicaTotals | None = None
    restart: FleetRestart | None = None
    text_exposed: bool = False
    """Whether the server keeps requests' text (``--expose-text``): the detail view's source."""
    waits: WaitSummary | None = None
    """Where the waiting went (None from a server older than issue 41: the panel hides)."""

    @property
    def draining_to(self) -> int | None:
        """The scheduler's "draining to N": a lowered cap with more than N running (None when
        not draining, or from a server that does not report it)."""
        value = self.scheduler.get("draining_to")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def draining_replicas(self) -> set[str]:
        """Replicas being drained: flagged themselves, or named by a running restart."""
        names = {r.replica for r in self.replicas if r.draining}
        if self.restart is not None and self.restart.state == "running" and self.restart.draining:
            names.add(self.restart.draining)
        return names


class Job(Model):
    id: str
    interval_s: float | None = None
    next_run_at: str | None = None
    on_time: bool = True
    last_runs: list[ReclaimRun] = Field(default_factory=list)


class JobsView(Model):
    jobs: list[Job] = Field(default_factory=list)


class Health(Model):
    status: str
    model: str | None = None
    policy: str | None = None
    version: int | None = None
    reclaim_job_on_time: bool | None = None


# -- policy engine: schedules and the guardrail (docs/api.md) --------------------------------


class Schedule(Model):
    id: int
    cron: str
    cron_seconds: str | None = None
    until: str
    timezone: str = "UTC"
    policy: PolicySpec
    memory_reserve: float | None = None
    reason: str = ""
    priority: int = 0
    actor: str | None = None
    next_run_at: str | None = None
    """The next firing, UTC."""
    active: bool = False
    window_start: str | None = None
    applied_version: int | None = None
    last_end_at: str | None = None
    last_end: str | None = None


class ScheduleList(Model):
    items: list[Schedule] = Field(default_factory=list)
    active: int | None = None


class KnobRange(Model):
    min: float
    max: float


class GuardrailBounds(Model):
    """``policies`` plus one ``{min, max}`` (or null: never moved) per knob; knobs a newer
    server adds are kept as extra fields and read by ``knobs``."""

    policies: list[str] = Field(default_factory=list)

    def knobs(self) -> dict[str, KnobRange | None]:
        extra = self.model_extra or {}
        return {k: None if v is None else KnobRange.model_validate(v) for k, v in extra.items()}


class Objectives(Model):
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    goodput_min_rps: float | None = None


class GuardrailConfig(Model):
    mode: str = "off"
    objectives: Objectives = Field(default_factory=Objectives)
    bounds: GuardrailBounds = Field(default_factory=GuardrailBounds)
    interval_s: float | None = None
    window_s: float | None = None
    min_change_interval_s: float | None = None
    hysteresis: float | None = None
    max_candidates: int | None = None


class Figures(Model):
    """Observed (``ObservedFigures``) or predicted (``SettingPrediction``): the same names."""

    since: str | None = None
    until: str | None = None
    requests: int = 0
    output_tokens_per_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    goodput_rps: float | None = None


class GuardrailStatus(Model):
    active: bool = False
    reason: str | None = None
    cost_model: str | None = None
    correction: float | None = None
    margin: float | None = None
    observed: Figures | None = None
    last_evaluation_at: str | None = None
    last_change_at: str | None = None
    window_active: int | None = None


class GuardrailView(Model):
    config: GuardrailConfig
    revision: int = 0
    actor: str | None = None
    reason: str | None = None
    updated_at: str | None = None
    status: GuardrailStatus = Field(default_factory=GuardrailStatus)


class Candidate(Model):
    settings: PolicySettings
    prediction: Figures
    meets: bool = False
    margin: float | None = None


class Decision(Model):
    id: int
    at: str | None = None
    mode: str = ""
    outcome: str
    reason: str = ""
    current: PolicySettings | None = None
    chosen: PolicySettings | None = None
    predicted_current: Figures | None = None
    predicted: Figures | None = None
    candidates: list[Candidate] = Field(default_factory=list)
    observed_before: Figures | None = None
    correction: float | None = None
    trace_requests: int = 0
    version: int | None = None
    observed_after: Figures | None = None
    prediction_error: dict[str, float] | None = None


class DecisionList(Model):
    items: list[Decision] = Field(default_factory=list)
