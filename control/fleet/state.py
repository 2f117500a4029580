"""The fleet's state as one engine's: every replica's snapshot summed into the shape
``/admin/state`` and the console read for a single engine (each replica's own stays in
``replicas``), and the KV self-check of every replica."""

from __future__ import annotations

from collections.abc import Mapping

from engine.kv_stats import KVIntegrity, KVStats
from engine.timeline import CauseCount, WaitSummary
from policies.snapshot import PolicySnapshot
from serving.snapshot import (
    EngineSnapshot,
    Latency,
    Percentiles,
    QueueDepths,
    TenantSnapshot,
    Throughput,
    Totals,
)

MAX_RECLAIMS = 10


def merged_snapshot(snapshots: Mapping[str, EngineSnapshot]) -> EngineSnapshot:
    """Counts, tokens and rates summed; requests and sweeps listed together; each latency
    percentile the worst replica's (an upper bound: percentiles do not add); the policy that
    of the first replica by id (they all run the version in force; ``replicas`` shows each).
    ``LookupError`` without a replica."""
    if not snapshots:
        raise LookupError("no replica is up")
    snaps = [snapshots[r] for r in sorted(snapshots)]
    first = snaps[0]
    steps = sum(s.totals.steps for s in snaps)
    return EngineSnapshot(
        policy=first.policy,
        policy_version=first.policy_version,
        scheduler=PolicySnapshot(
            policy=first.scheduler.policy,
            params=first.scheduler.params,
            waiting=sum(s.scheduler.waiting for s in snaps),
            running=sum(s.scheduler.running for s in snaps),
            preemptions=sum(s.scheduler.preemptions for s in snaps),
            overdue=sum(s.scheduler.overdue for s in snaps),
        ),
        queue=QueueDepths(
            waiting=sum(s.queue.waiting for s in snaps),
            running=sum(s.queue.running for s in snaps),
            max_waiting=sum(s.queue.max_waiting for s in snaps),
        ),
        memory_reserve=first.memory_reserve,
        uptime_s=max(s.uptime_s for s in snaps),
        requests=tuple(r for s in snaps for r in s.requests),
        queue_order=first.queue_order,
        compute=first.compute,
        tenants=_tenants([s.tenants for s in snaps]),
        kv=_summed([s.kv for s in snaps]),
        block_map="|".join(s.block_map for s in snaps),
        throughput=Throughput(
            output_tokens_per_s=sum(s.throughput.output_tokens_per_s for s in snaps),
            prompt_tokens_per_s=sum(s.throughput.prompt_tokens_per_s for s in snaps),
            steps_per_s=sum(s.throughput.steps_per_s for s in snaps),
        ),
        latency=Latency(
            ttft=_worst([s.latency.ttft for s in snaps]),
            tpot=_worst([s.latency.tpot for s in snaps]),
            e2e=_worst([s.latency.e2e for s in snaps]),
        ),
        totals=Totals(
            steps=steps,
            prompt_tokens=sum(s.totals.prompt_tokens for s in snaps),
            generation_tokens=sum(s.totals.generation_tokens for s in snaps),
            padded_tokens=sum(s.totals.padded_tokens for s in snaps),
            preemptions=sum(s.totals.preemptions for s in snaps),
            preemptions_by_cause=CauseCount.summed(
                c for s in snaps for c in s.totals.preemptions_by_cause
            ),
            requests_finished=sum(s.totals.requests_finished for s in snaps),
            engine_overhead=(
                sum(s.totals.engine_overhead * s.totals.steps for s in snaps) / steps
                if steps
                else 0.0
            ),
            step_seconds=sum(s.totals.step_seconds for s in snaps),
            step_cpu_seconds=sum(s.totals.step_cpu_seconds for s in snaps),
        ),
        reclaims=tuple(sorted((r for s in snaps for r in s.reclaims), key=lambda r: r.time))[
            -MAX_RECLAIMS:
        ],
        waits=WaitSummary.merged([s.waits for s in snaps if s.waits is not None]),
    )


def _worst(each: list[Percentiles]) -> Percentiles:
    def top(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return Percentiles(
        p50=top([p.p50 for p in each]),
        p95=top([p.p95 for p in each]),
        p99=top([p.p99 for p in each]),
    )


def merged_integrity(checks: Mapping[str, KVIntegrity]) -> KVIntegrity:
    """Every replica's self-check: ok when all are, each problem named by its replica."""
    if not checks:
        raise LookupError("no replica is up")
    return KVIntegrity(
        ok=all(c.ok for c in checks.values()),
        problems=tuple(f"{r}: {p}" for r in sorted(checks) for p in checks[r].problems),
        stats=_summed([checks[r].stats for r in sorted(checks)]),
    )


def _summed(each: list[KVStats]) -> KVStats:
    return KVStats(
        block_size=each[0].block_size,
        total=sum(s.total for s in each),
        free=sum(s.free for s in each),
        used=sum(s.used for s in each),
        cached=sum(s.cached for s in each),
        reserved=sum(s.reserved for s in each),
        live_tokens=sum(s.live_tokens for s in each),
        held_slots=sum(s.held_slots for s in each),
    )


def _tenants(per_replica: list[tuple[TenantSnapshot, ...]]) -> tuple[TenantSnapshot, ...]:
    """Each tenant's figures summed over the replicas (its counter too: each replica keeps
    its own, so the sum is its weighted service in the fleet), by first seen."""
    merged: dict[str, TenantSnapshot] = {}
    for tenants in per_replica:
        for t in tenants:
            seen = merged.get(t.name)
            merged[t.name] = (
                t
                if seen is None
                else seen.model_copy(
                    update={
                        "counter": seen.counter + t.counter,
                        "service": seen.service + t.service,
                        "input_tokens": seen.input_tokens + t.input_tokens,
                        "output_tokens": seen.output_tokens + t.output_tokens,
                        "waiting": seen.waiting + t.waiting,
                        "running": seen.running + t.running,
                        "refused": seen.refused + t.refused,
                    }
                )
            )
    return tuple(merged.values())
