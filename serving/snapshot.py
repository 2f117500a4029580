"""``EngineSnapshot``: a frozen, typed picture of the engine taken at a step boundary.

It is what ``/admin/state``, the Prometheus gauges and the console read, by attribute: the
requests, queue depths, KV accounting and block map, the policy's own typed snapshot, the
policy version the engine runs, and the recent statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny
from pydantic.dataclasses import dataclass

from engine.cpu import ComputeChoice
from engine.kv_stats import KVStats, ReclaimResult
from engine.sequence import Sequence, SequenceStatus
from engine.stats import EngineStats, percentile
from engine.tenants import TenantAccount
from engine.timeline import (
    CauseCount,
    HeldShare,
    RequestTimeline,
    TimelineRecorder,
    WaitNow,
    WaitSummary,
)
from policies.queue import QueueSpec
from policies.snapshot import PolicySnapshot
from policies.spec import PolicySpec

if TYPE_CHECKING:
    from engine.kv_cache import BlockManager

FROZEN = ConfigDict(frozen=True, from_attributes=True)


class RequestSnapshot(BaseModel):
    model_config = FROZEN
    id: str
    state: str = Field(description="waiting, running or finished.")
    prompt_tokens: int
    generated_tokens: int
    blocks: int = Field(description="KV blocks the request holds.")
    age_s: float = Field(description="Seconds since it arrived.")
    preemptions: int
    tenant: str = Field(description="Who it belongs to (its API key's name, or its user).")
    priority: int = Field(description="Lower is served earlier under the priority queue.")
    constrained: bool = Field(
        False, description="A grammar constrains its output (response_format, structured_outputs)."
    )
    wait: WaitNow | None = Field(
        None,
        description="Why it waits now (waiting requests): its reason, what holds it (its own "
        "constraint, or the queue head's when it waits behind it) and since when "
        "(docs/observability.md).",
    )

    @classmethod
    def of(
        cls, seq: Sequence, blocks: int, now: float, wait: WaitNow | None = None
    ) -> RequestSnapshot:
        return cls(
            id=seq.seq_id,
            state=seq.status.value,
            prompt_tokens=seq.num_prompt_tokens,
            generated_tokens=seq.num_output_tokens,
            blocks=blocks,
            age_s=now - seq.arrival_time,
            preemptions=seq.num_preemptions,
            tenant=seq.tenant,
            priority=seq.priority,
            constrained=seq.grammar is not None,
            wait=wait,
        )


class TenantSnapshot(BaseModel):
    """One tenant's service so far (engine/tenants.py), with its requests now."""

    model_config = FROZEN
    name: str
    weight: float = Field(description="Its share weight under the fair queue.")
    counter: float = Field(
        description="Its virtual token counter: weighted service over its weight (VTC)."
    )
    service: float = Field(
        0.0,
        description="Weighted service: prompt and output tokens by the token weights in "
        "force (VTC's w_p, w_q), not divided by its weight.",
    )
    input_tokens: int = Field(description="Prompt tokens served (charged when scheduled).")
    output_tokens: int = Field(description="Output tokens served.")
    waiting: int
    running: int
    refused: int = Field(description="Requests refused with 429 (a full queue or its quota).")

    @classmethod
    def of(cls, account: TenantAccount, seqs: list[Sequence]) -> TenantSnapshot:
        return cls(
            name=account.name,
            weight=account.weight,
            counter=account.counter,
            service=account.weight
            * (
                account.input_cost * account.input_tokens
                + account.output_cost * account.output_tokens
            ),
            input_tokens=account.input_tokens,
            output_tokens=account.output_tokens,
            waiting=sum(s.status is SequenceStatus.WAITING for s in seqs),
            running=sum(s.status is SequenceStatus.RUNNING for s in seqs),
            refused=account.refused,
        )


class QueueDepths(BaseModel):
    model_config = FROZEN
    waiting: int
    running: int
    max_waiting: int = Field(description="Waiting requests before new ones get 429.")


class Throughput(BaseModel):
    model_config = FROZEN
    output_tokens_per_s: float
    prompt_tokens_per_s: float
    steps_per_s: float


class Percentiles(BaseModel):
    model_config = FROZEN
    p50: float | None
    p95: float | None
    p99: float | None


class Latency(BaseModel):
    model_config = FROZEN
    ttft: Percentiles
    tpot: Percentiles
    e2e: Percentiles


class Totals(BaseModel):
    model_config = FROZEN
    steps: int
    prompt_tokens: int
    generation_tokens: int
    padded_tokens: int
    preemptions: int
    preemptions_by_cause: tuple[CauseCount, ...] = Field(
        (), description="preemptions by cause: memory (the pool ran dry), priority."
    )
    requests_finished: int
    engine_overhead: float = Field(description="Share of step time outside the forward.")
    step_seconds: float = Field(0.0, description="Wall seconds the engine spent in its steps.")
    step_cpu_seconds: float = Field(
        0.0,
        description="The stepping thread's own CPU seconds in those steps: below step_seconds "
        "by what it waited for (the GIL, a core, the other intra-op threads).",
    )

    @classmethod
    def of(cls, stats: EngineStats) -> Totals:
        return cls(
            steps=stats.num_steps,
            prompt_tokens=stats.prompt_tokens,
            generation_tokens=stats.generation_tokens,
            padded_tokens=stats.padded_tokens,
            preemptions=stats.preemptions,
            preemptions_by_cause=stats.preemptions_by_cause(),
            requests_finished=stats.requests_finished,
            engine_overhead=stats.engine_overhead,
            step_seconds=stats.wall_s,
            step_cpu_seconds=stats.cpu_s,
        )


@dataclass(frozen=True)
class ReclaimRecord(ReclaimResult):
    """One reclaim sweep the engine ran, and when (the engine's clock)."""

    time: float


class ComputeState(BaseModel):
    """The dtype and the decode attention in force, each with why (``engine.cpu``)."""

    model_config = FROZEN

    cpu: str = Field(description="The CPU as the kernels see it (the device on a GPU).")
    dtype: str = Field(description="The weights' and KV's dtype in force.")
    dtype_reason: str = Field(description="Why: asked for, or auto's choice for this CPU.")
    attention: str = Field(description="Decode attention: native, torch or triton.")
    attention_reason: str


class EngineSnapshot(BaseModel):
    model_config = FROZEN

    policy: PolicySpec = Field(description="The policy the engine runs.")
    policy_version: int | None = Field(
        None, description="The version given with that policy to set_policy, if any."
    )
    scheduler: SerializeAsAny[PolicySnapshot] = Field(
        description="The policy's own snapshot (its subclass adds the policy's fields)."
    )
    queue: QueueDepths = Field(description="Waiting includes requests not yet taken in.")
    memory_reserve: float
    uptime_s: float
    requests: tuple[RequestSnapshot, ...]
    queue_order: QueueSpec = Field(description="The queue discipline in force.")
    tenants: tuple[TenantSnapshot, ...] = Field(description="Every tenant seen, by first seen.")
    kv: KVStats
    block_map: str = Field(description="One character per block: '.' free, '#' used, 'c' cached.")
    throughput: Throughput
    latency: Latency
    totals: Totals
    reclaims: tuple[ReclaimRecord, ...] = Field(description="The last sweeps, oldest first.")
    compute: ComputeState | None = Field(
        None, description="The dtype and attention in force and why (None: a simulated runner)."
    )
    waits: WaitSummary | None = Field(
        None,
        description="Where the waiting went, by what held the queue's head: over the last "
        "window and since the start; and what holds the head now (docs/observability.md).",
    )

    @classmethod
    def of(
        cls,
        *,
        now: float,
        started_at: float,
        policy: PolicySpec,
        policy_version: int | None,
        scheduler: PolicySnapshot,
        sequences: Iterable[Sequence],
        queued: list[Sequence],
        max_waiting: int,
        queue_order: QueueSpec,
        tenants: Iterable[TenantAccount],
        blocks: BlockManager,
        stats: EngineStats,
        compute: ComputeChoice | None = None,
        timelines: TimelineRecorder | None = None,
    ) -> EngineSnapshot:
        """The picture of an engine at a step boundary: ``sequences`` are the ones it has taken
        in, ``queued`` the ones not taken in yet (they count as waiting), ``scheduler`` the
        running policy's own snapshot."""
        seqs = [*sequences, *queued]
        waiting = timelines.waiting_now if timelines is not None else _no_wait
        requests = tuple(
            RequestSnapshot.of(
                s,
                len(blocks.table(s.seq_id)) if blocks.holds(s.seq_id) else 0,
                now,
                waiting(s.seq_id, now) if s.status is SequenceStatus.WAITING else None,
            )
            for s in seqs
        )
        by_tenant: dict[str, list[Sequence]] = {}
        for seq in seqs:
            by_tenant.setdefault(seq.tenant, []).append(seq)
        # a fresh model: the queued requests count as waiting
        scheduler = scheduler.model_copy(update={"waiting": scheduler.waiting + len(queued)})
        return cls(
            policy=policy,
            policy_version=policy_version,
            scheduler=scheduler,
            queue=QueueDepths(
                waiting=scheduler.waiting, running=scheduler.running, max_waiting=max_waiting
            ),
            memory_reserve=blocks.memory_reserve,
            uptime_s=now - started_at,
            requests=requests,
            queue_order=queue_order,
            tenants=tuple(TenantSnapshot.of(a, by_tenant.get(a.name, [])) for a in tenants),
            kv=blocks.stats(),
            block_map=blocks.block_map(),
            throughput=Throughput.model_validate(stats.throughput(now)),
            latency=Latency.model_validate(stats.latency(now)),
            totals=Totals.of(stats),
            reclaims=tuple(
                ReclaimRecord(**asdict(r), time=t) for t, r in list(stats.reclaims)[-10:]
            ),
            compute=None if compute is None else ComputeState.model_validate(compute),
            waits=None if timelines is None else _waits(timelines, now),
        )


def _no_wait(seq_id: str, now: float) -> WaitNow | None:
    return None


def _waits(timelines: TimelineRecorder, now: float) -> WaitSummary:
    """The recorder's summary, with its tail: the waiting, by reason, of the requests that
    finished in the window at or over its TTFT p99."""
    summary = timelines.summary(now)
    finished = timelines.finished_since(now - summary.window_s)
    timed = [(t, ttft) for t in finished if (ttft := t.ttft) is not None]
    p99 = percentile([ttft for _, ttft in timed], 99)
    if p99 is None:
        return summary
    over: list[RequestTimeline] = [t for t, ttft in timed if ttft >= p99]
    tail = HeldShare.summed(HeldShare(r, s) for t in over for r, s in t.waited().items())
    return dataclasses.replace(summary, tail_ttft_s=p99, tail=tail)
