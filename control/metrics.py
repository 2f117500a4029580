"""Prometheus metrics in a registry of their own (one per app, never the global one).

Engine-wide figures (queue depths, KV blocks, token and preemption totals) are read from the
engine snapshot taken at scrape time; latencies are observed as requests finish; maintenance
and policy changes count themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control.chat.template import RenderFailure
from engine.outputs import RequestOutput
from engine.tenants import OTHER_TENANT
from engine.timeline import PreemptCause, WaitReason
from serving.snapshot import EngineSnapshot, TenantSnapshot

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
RECLAIM_OUTCOMES = ("ok", "error", "missed", "skipped")
POLICY_UPDATE_RESULTS = (
    "applied",
    "pending",
    "failed",
    "dry_run",
    "invalid",
    "conflict",
    "not_found",
    "unchanged",
)
KV_STATES = ("free", "used", "cached")
REFUSAL_REASONS = (
    "invalid",
    "too_large",
    "unauthorized",
    "unknown_model",
    "not_found",
    "queue_full",
    "unavailable",
)
"""Why a ``/v1`` request was refused (4xx, 503): the ``reason`` label of
``servedeck_requests_refused_total``."""
GUARDRAIL_OUTCOMES = ("applied", "shadow", "rate_limited", "window_active", "conflict", "failed")
"""``control.guardrail.schemas.Outcome``: the ``outcome`` label of the decisions counter."""
POLICY_PREEMPTIONS = (PreemptCause.MEMORY, PreemptCause.PRIORITY)
"""The ``cause`` label of ``servedeck_preemptions_total``: what a policy preempts for (an
admission undone with a failed step is requeued, not counted)."""
GUARDRAIL_MODES = ("off", "shadow", "on")
METRIC_TENANTS = 32
"""Tenants with a label of their own (the most served); the rest are summed as ``other``."""
METRIC_PRIORITIES = 16
"""Priority values with a label of their own (the first seen); later ones count as ``other``."""


class EngineCollector(Collector):
    """Gauges and counters from the latest engine snapshot (refreshed by each scrape)."""

    def __init__(self) -> None:
        self.snapshot: EngineSnapshot | None = None

    def refresh(self, latest: Callable[[], EngineSnapshot | None]) -> None:
        """Before a scrape: the newest snapshot, or the last one kept when none came."""
        if (snapshot := latest()) is not None:
            self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        scheduler, kv, totals = (snap.scheduler, snap.kv, snap.totals) if snap else (None,) * 3
        yield _gauge(
            "servedeck_requests_running",
            "Requests running.",
            None if scheduler is None else scheduler.running,
        )
        yield _gauge(
            "servedeck_requests_waiting",
            "Requests waiting.",
            None if scheduler is None else scheduler.waiting,
        )
        yield _gauge(
            "servedeck_requests_constrained",
            "Requests running whose output a grammar constrains (response_format, "
            "structured_outputs).",
            None
            if snap is None
            else sum(r.constrained and r.state == "running" for r in snap.requests),
        )
        yield _gauge(
            "servedeck_requests_waiting_max",
            "Waiting requests before new ones get 429 (max_waiting).",
            None if snap is None else snap.queue.max_waiting,
        )
        blocks = GaugeMetricFamily("servedeck_kv_blocks", "KV blocks by state.", labels=["state"])
        by_state = {"free": kv.free, "used": kv.used, "cached": kv.cached} if kv else {}
        for state in KV_STATES:
            blocks.add_metric([state], by_state.get(state, 0))
        yield blocks
        yield _gauge(
            "servedeck_kv_usage_ratio",
            "Used KV blocks / all blocks.",
            None if kv is None else kv.usage,
        )
        yield _gauge(
            "servedeck_kv_reserve_ratio",
            "Fraction of KV blocks admission must leave free.",
            None if snap is None else snap.memory_reserve,
        )
        yield _counter(
            "servedeck_prompt_tokens",
            "Prompt tokens computed.",
            None if totals is None else totals.prompt_tokens,
        )
        yield _counter(
            "servedeck_generation_tokens",
            "Tokens generated.",
            None if totals is None else totals.generation_tokens,
        )
        yield _counter(
            "servedeck_engine_step_seconds",
            "Wall seconds the engine spent in its steps.",
            None if totals is None else totals.step_seconds,
        )
        yield _counter(
            "servedeck_engine_step_cpu_seconds",
            "The stepping thread's own CPU seconds in its steps (time.thread_time): below "
            "servedeck_engine_step_seconds by what it waited for (the GIL, a core, the other "
            "intra-op threads).",
            None if totals is None else totals.step_cpu_seconds,
        )
        preempted = CounterMetricFamily(
            "servedeck_preemptions",
            "Sequences preempted (recompute), by cause: memory (the pool ran dry), priority "
            "(a waiting request of a lower priority value took its place).",
            labels=["cause"],
        )
        by_cause = {c.cause: c.count for c in totals.preemptions_by_cause} if totals else {}
        for cause in POLICY_PREEMPTIONS:
            preempted.add_metric([cause.value], by_cause.get(cause, 0))
        yield preempted
        yield from _tenant_metrics(snap.tenants if snap else ())
        waited = CounterMetricFamily(
            "servedeck_request_wait_seconds",
            "Seconds requests waited, by what held the queue's head (reason: "
            "docs/observability.md's vocabulary; open waits included).",
            labels=["reason"],
        )
        by_reason = {s.reason: s.seconds for s in snap.waits.total} if snap and snap.waits else {}
        for reason in WaitReason:
            waited.add_metric([reason.value], by_reason.get(reason, 0.0))
        yield waited


def _tenant_metrics(tenants: Iterable[TenantSnapshot]) -> Iterator[Metric]:
    """Served tokens, waiting requests and refusals by tenant: the ``METRIC_TENANTS`` most
    served by name, the rest summed as ``other`` (the label set stays bounded)."""
    ranked = sorted(tenants, key=lambda t: t.input_tokens + t.output_tokens, reverse=True)
    named, rest = ranked[:METRIC_TENANTS], ranked[METRIC_TENANTS:]
    rows = [(t.name, t.input_tokens, t.output_tokens, t.waiting, t.refused) for t in named]
    if rest:
        rows.append(
            (
                OTHER_TENANT,
                sum(t.input_tokens for t in rest),
                sum(t.output_tokens for t in rest),
                sum(t.waiting for t in rest),
                sum(t.refused for t in rest),
            )
        )
    served = CounterMetricFamily(
        "servedeck_tenant_served_tokens",
        "Tokens served by tenant (kind: input, output).",
        labels=["tenant", "kind"],
    )
    waiting = GaugeMetricFamily(
        "servedeck_tenant_requests_waiting", "Requests waiting by tenant.", labels=["tenant"]
    )
    refused = CounterMetricFamily(
        "servedeck_tenant_requests_refused",
        "Requests refused with a full queue or quota (429) by tenant.",
        labels=["tenant"],
    )
    for name, input_tokens, output_tokens, queued, refusals in rows:
        served.add_metric([name, "input"], input_tokens)
        served.add_metric([name, "output"], output_tokens)
        waiting.add_metric([name], queued)
        refused.add_metric([name], refusals)
    yield served
    yield waiting
    yield refused


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value or 0)


def _counter(name: str, documentation: str, value: float | None) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value or 0)


class ControlMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.engine = EngineCollector()
        r.register(self.engine)
        self.ttft = Histogram(
            "servedeck_time_to_first_token_seconds",
            "Arrival to first token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "servedeck_time_per_output_token_seconds",
            "Mean time per output token after the first.",
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "servedeck_e2e_request_latency_seconds",
            "Arrival to finish.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "servedeck_request_queue_time_seconds",
            "Arrival to first scheduled (vLLM's request_queue_time_seconds).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.priority_ttft = Histogram(
            "servedeck_priority_time_to_first_token_seconds",
            "Arrival to first token, by the request's priority.",
            ["priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.priority_tpot = Histogram(
            "servedeck_priority_time_per_output_token_seconds",
            "Mean time per output token after the first, by the request's priority.",
            ["priority"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self._priorities: set[int] = set()
        self.reclaimed_blocks = Counter(
            "servedeck_reclaimed_blocks", "Leaked KV blocks the sweep freed.", registry=r
        )
        self.evicted_blocks = Counter(
            "servedeck_evicted_blocks",
            "Cached prefix blocks the reserve guard evicted.",
            registry=r,
        )
        self.reclaim_runs = Counter(
            "servedeck_reclaim_runs", "Reclaim sweeps by outcome.", ["outcome"], registry=r
        )
        self.policy_updates = Counter(
            "servedeck_policy_updates", "Policy change attempts by result.", ["result"], registry=r
        )
        self.schedule_window_active = Gauge(
            "servedeck_schedule_window_active",
            "1 for the schedule whose window is in force, 0 for the other schedules.",
            ["schedule"],
            registry=r,
        )
        self.policy_info = Gauge(
            "servedeck_policy_info",
            "The active policy and version.",
            ["policy", "version"],
            registry=r,
        )
        self.engine_stalls = Counter(
            "servedeck_engine_stalls",
            "Times the engine loop had work but made no progress for stall_timeout_s.",
            registry=r,
        )
        self.requests_refused = Counter(
            "servedeck_requests_refused",
            "Requests to /v1 refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.requests_failed = Counter(
            "servedeck_requests_failed",
            "Requests to /v1 that failed on the server's side (500, or an error mid-stream).",
            registry=r,
        )
        self.chat_template_renders = Gauge(
            "servedeck_chat_template_renders_in_flight",
            "Conversations a chat template worker is rendering now.",
            registry=r,
        )
        self.chat_template_failures = Counter(
            "servedeck_chat_template_failures",
            "Chat template renders that failed, by cause (timeout, output_too_large, ...).",
            ["cause"],
            registry=r,
        )
        for cause in get_args(RenderFailure):
            self.chat_template_failures.labels(cause)
        self.guardrail_decisions = Counter(
            "servedeck_guardrail_decisions",
            "Guardrail proposals by outcome (applied, shadow, rate_limited, ...).",
            ["outcome"],
            registry=r,
        )
        self.guardrail_margin = Gauge(
            "servedeck_guardrail_margin",
            "Observed margin: min over the objectives of (objective - figure) / objective "
            "(NaN: not known).",
            registry=r,
        )
        self.guardrail_correction = Gauge(
            "servedeck_guardrail_correction",
            "The cost model's correction, observed / predicted step time (NaN: not known).",
            registry=r,
        )
        self.guardrail_mode = Gauge(
            "servedeck_guardrail_mode", "1 for the guardrail's mode.", ["mode"], registry=r
        )
        self.guardrail_margin.set(math.nan)
        self.guardrail_correction.set(math.nan)
        self.set_guardrail_mode("off")
        for outcome in GUARDRAIL_OUTCOMES:
            self.guardrail_decisions.labels(outcome)
        for reason in REFUSAL_REASONS:
            self.requests_refused.labels(reason)
        for outcome in RECLAIM_OUTCOMES:
            self.reclaim_runs.labels(outcome)
        for result in POLICY_UPDATE_RESULTS:
            self.policy_updates.labels(result)

    def observe_finished(self, output: RequestOutput) -> None:
        if output.finish_reason == "abort":
            return
        m = output.metrics
        for histogram, value in (
            (self.ttft, m.ttft),
            (self.tpot, m.tpot),
            (self.e2e, m.e2e),
            (self.queue_time, m.queue_time),
        ):
            if value is not None:
                histogram.observe(value)
        label = self._priority_label(output.priority)
        for by_priority, value in ((self.priority_ttft, m.ttft), (self.priority_tpot, m.tpot)):
            if value is not None:
                by_priority.labels(label).observe(value)

    def _priority_label(self, priority: int) -> str:
        if priority not in self._priorities and len(self._priorities) < METRIC_PRIORITIES:
            self._priorities.add(priority)
        return str(priority) if priority in self._priorities else "other"

    def set_policy(self, name: str, version: int) -> None:
        self.policy_info.clear()
        self.policy_info.labels(name, str(version)).set(1)

    def count_reclaim(self, outcome: str, freed: int = 0, evicted: int = 0) -> None:
        self.reclaim_runs.labels(outcome).inc()
        self.reclaimed_blocks.inc(freed)
        self.evicted_blocks.inc(evicted)

    def count_refused(self, reason: str) -> None:
        self.requests_refused.labels(reason).inc()

    def count_failed(self) -> None:
        self.requests_failed.inc()

    def count_policy_update(self, result: str) -> None:
        self.policy_updates.labels(result).inc()

    def set_schedule_windows(self, active: int | None, schedule_ids: list[int]) -> None:
        """1 for the schedule whose window is in force, 0 for every other live schedule."""
        self.schedule_window_active.clear()
        for schedule_id in schedule_ids:
            self.schedule_window_active.labels(str(schedule_id)).set(schedule_id == active)

    def set_guardrail_mode(self, mode: str) -> None:
        for name in GUARDRAIL_MODES:
            self.guardrail_mode.labels(name).set(name == mode)

    def set_guardrail_figures(self, margin: float | None, correction: float | None) -> None:
        """The last evaluation's observed margin and correction; NaN where not known."""
        self.guardrail_margin.set(math.nan if margin is None else margin)
        self.guardrail_correction.set(math.nan if correction is None else correction)

    def count_guardrail_decision(self, outcome: str) -> None:
        self.guardrail_decisions.labels(outcome).inc()

    def count_stall(self) -> None:
        self.engine_stalls.inc()

    def render(self, latest: Callable[[], EngineSnapshot | None]) -> bytes:
        """The exposition; ``latest`` (the engine's snapshot now, None when there is none) is
        called only by a collector that reads it: a fleet's reads each replica's own."""
        self.engine.refresh(latest)
        return generate_latest(self.registry)
