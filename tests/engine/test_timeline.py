"""Issue 41: every request's timeline, and the reason for every wait, under continuous + fcfs.

The real ``LLMEngine`` and policy run with no model: a runner that samples token 0 and moves a
virtual clock by a step time that grows with the step's tokens, so the runs are exact and
fast. Requests arrive at random steps; small limits force every constraint, preemptions by a
small pool among them, and some requests are aborted.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.batch import ScheduledBatch, StepResult
from engine.config import EngineConfig, EngineLimits
from engine.front import QueuedPrompt
from engine.outputs import RequestMetrics
from engine.sampling_params import SamplingParams
from engine.stats import percentile
from engine.timeline import (
    BlocksShort,
    CauseCount,
    EventKind,
    Hold,
    Phase,
    PreemptCause,
    RequestTimeline,
    SeqsFull,
    TokenBudget,
    WaitReason,
)
from policies.queue import FairQueue, FcfsQueue, PriorityQueue, QueueSpec
from serving.engine import LLMEngine

BLOCK = 16
OWN_REASONS = (
    WaitReason.KV_BLOCKS_SHORT,
    WaitReason.MAX_NUM_SEQS,
    WaitReason.PROMPT_BUDGET_SPENT,
)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class CostRunner:
    """Token 0 for every sampling row; a step takes 1 ms plus 10 µs per token."""

    last_forward_s = 0.0

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def execute(self, batch: ScheduledBatch) -> StepResult:
        tokens = sum(e.num_new_tokens for e in batch.entries)
        self.clock.now += 0.001 + 1e-5 * tokens
        return StepResult([0 for e in batch.entries if e.sample])


@dataclass(frozen=True)
class Arrival:
    step: int
    prompt: int
    output: int
    abort_after: int | None = None
    """Abort it this many steps after it arrived (None: it runs to its end)."""
    priority: int = 0
    tenant: str = "default"


@dataclass(frozen=True)
class Limits:
    num_kv_blocks: int = 14
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 64
    max_prefill_tokens: int | None = 32
    memory_reserve: float = 0.1


@dataclass
class Run:
    timelines: dict[str, RequestTimeline]
    metrics: dict[str, RequestMetrics]
    aborted: set[str] = field(default_factory=set)
    preemptions: int = 0
    by_cause: tuple[CauseCount, ...] = ()

    def reasons(self) -> set[WaitReason]:
        """Every reason a wait was held by (its own or, behind the head, the head's)."""
        seen = set()
        for timeline in self.timelines.values():
            for seg in timeline.segments:
                if seg.phase is Phase.WAITING:
                    seen.add(seg.reason)
                    seen.update(share.reason for share in seg.held_by)
        return seen


def policy_spec(name: str, limits: Limits) -> dict[str, object]:
    if name in ("static", "dynamic"):
        return {"name": name, "params": {"max_batch_size": limits.max_num_seqs}}
    params = {"max_prefill_tokens": limits.max_prefill_tokens, "max_wait_s": None}
    return {"name": name, "params": params}


def run(
    arrivals: list[Arrival],
    limits: Limits = Limits(),
    policy: str = "continuous",
    queue: QueueSpec | None = None,
) -> Run:
    clock = Clock()
    longest = max(a.prompt + a.output for a in arrivals)
    config = EngineConfig(
        model="none",
        block_size=BLOCK,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        memory_reserve=limits.memory_reserve,
        max_waiting=len(arrivals) + 1,
        timelines_kept=len(arrivals),
    )
    engine_limits = EngineLimits(
        block_size=BLOCK,
        num_kv_blocks=limits.num_kv_blocks,
        max_model_len=longest + 1,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
    )
    engine = LLMEngine(
        config,
        CostRunner(clock),
        engine_limits,
        vocab_size=1000,
        clock=clock,
        policy=policy_spec(policy, limits),
        queue=queue,
    )
    rng = random.Random(7)
    pending = sorted(enumerate(arrivals), key=lambda ia: ia[1].step)
    aborts: dict[int, list[str]] = {}
    result = Run({}, {})
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1].step <= step:
            i, arrival = pending.pop(0)
            tokens = [rng.randrange(1000) for _ in range(arrival.prompt)]
            params = SamplingParams(max_tokens=arrival.output, ignore_eos=True)
            queued = QueuedPrompt(tokens, params, f"r{i}", arrival.priority, arrival.tenant)
            engine.add_requests([queued], clock.now)
            if arrival.abort_after is not None:
                aborts.setdefault(step + arrival.abort_after, []).append(f"r{i}")
        for request_id in aborts.pop(step, []):
            if engine.abort(request_id).result():
                result.aborted.add(request_id)
        for output in engine.step():
            if output.finished:
                result.metrics[output.request_id] = output.metrics
        clock.now += 0.0001  # the loop's own time between steps
        step += 1
        assert step < 100_000
    for request_id in result.metrics:
        timeline = engine.timelines.timeline(request_id, clock.now)
        assert timeline is not None and timeline.finished
        result.timelines[request_id] = timeline
    result.preemptions = engine.stats.preemptions
    result.by_cause = engine.snapshot().totals.preemptions_by_cause
    return result


def check_timeline(timeline: RequestTimeline, metrics: RequestMetrics) -> None:
    segments = timeline.segments
    assert segments, timeline
    assert segments[0].start == metrics.arrival_time
    assert segments[-1].end == metrics.finish_time
    for before, after in itertools.pairwise(segments):
        assert before.end == after.start, timeline  # no gap, no overlap
    for seg in segments:
        assert seg.end is not None and seg.end > seg.start, timeline
        if seg.phase is Phase.WAITING:
            assert seg.reason is not None
            assert abs(sum(s.seconds for s in seg.held_by) - (seg.end - seg.start)) < 1e-9
        if seg.phase is Phase.PREFILL:
            assert all(chunk > 0 for chunk in seg.chunks), timeline
    kinds = [event.kind for event in timeline.events]
    assert kinds[0] is EventKind.ARRIVED and kinds[-1] is EventKind.FINISHED
    ttft = metrics.ttft
    if ttft is None:
        assert EventKind.FIRST_TOKEN not in kinds
        assert all(seg.phase is not Phase.DECODE for seg in segments)
        return
    first_token = metrics.first_token_time
    assert [e.time for e in timeline.events if e.kind is EventKind.FIRST_TOKEN] == [first_token]
    before = [seg for seg in segments if seg.end is not None and seg.end <= first_token]
    assert all(seg.phase is not Phase.DECODE for seg in before)
    waited = sum(s.end - s.start for s in before if s.phase is Phase.WAITING and s.end)
    prefill = sum(s.end - s.start for s in before if s.phase is Phase.PREFILL and s.end)
    assert abs(waited + prefill - ttft) < 1e-3


def mixed_arrivals(n: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    out, step = [], 0
    for i in range(n):
        step += rng.choice((0, 0, 1, 2, 5))
        abort = rng.choice((3, 12)) if i % 9 == 4 else None
        priority, tenant = rng.choice((0, 0, 5)), rng.choice(("a", "b", "b"))
        out.append(Arrival(step, rng.randint(8, 72), rng.randint(1, 24), abort, priority, tenant))
    return out


def test_every_timeline_covers_arrival_to_end_and_sums_to_its_ttft():
    result = run(mixed_arrivals(60, seed=1))
    assert len(result.timelines) == 60
    for request_id, timeline in result.timelines.items():
        check_timeline(timeline, result.metrics[request_id])
    # the run exercised what the invariants are about
    assert result.preemptions > 0 and result.aborted
    assert set(OWN_REASONS) | {WaitReason.BEHIND_QUEUE} <= result.reasons()
    events = [e for t in result.timelines.values() for e in t.events]
    assert any(e.kind is EventKind.PREEMPTED and e.cause is PreemptCause.MEMORY for e in events)
    assert any(e.kind is EventKind.RESUMED for e in events)
    assert {e.finish_reason for e in events if e.kind is EventKind.FINISHED} == {"length", "abort"}
    resumed = [
        seg for t in result.timelines.values() for seg in t.segments if seg.phase is Phase.PREFILL
    ]
    assert any(seg.resumed for seg in resumed) and any(len(seg.chunks) > 1 for seg in resumed)


def test_each_reason_carries_its_figures():
    result = run(mixed_arrivals(60, seed=1))
    limits = Limits()
    figures = {
        seg.reason: seg.first
        for t in result.timelines.values()
        for seg in t.segments
        if seg.phase is Phase.WAITING and seg.reason in OWN_REASONS
    }
    kv = figures[WaitReason.KV_BLOCKS_SHORT]
    assert kv is not None and isinstance(kv.figures, BlocksShort)
    assert kv.figures.needed is None or kv.figures.needed > kv.figures.free
    seqs = figures[WaitReason.MAX_NUM_SEQS]
    assert seqs is not None and seqs.figures == SeqsFull(limits.max_num_seqs, limits.max_num_seqs)
    budget = figures[WaitReason.PROMPT_BUDGET_SPENT]
    assert budget is not None and isinstance(budget.figures, TokenBudget)
    assert budget.figures.left <= 0
    behind = [
        seg
        for t in result.timelines.values()
        for seg in t.segments
        if seg.reason is WaitReason.BEHIND_QUEUE
    ]
    assert behind and all(seg.ahead is not None and seg.ahead > 0 for seg in behind)
    assert all(seg.first is not None and seg.first.reason in OWN_REASONS for seg in behind)


def test_a_request_aborted_while_waiting_ends_in_its_wait():
    arrivals = [Arrival(0, 64, 24), Arrival(0, 64, 24), *[Arrival(0, 40, 4, 2)] * 6]
    result = run(arrivals, Limits(max_num_seqs=1))
    for request_id in result.aborted:
        timeline = result.timelines[request_id]
        check_timeline(timeline, result.metrics[request_id])
        assert [s.phase for s in timeline.segments] == [Phase.WAITING] * len(timeline.segments)


def test_timelines_are_bounded_and_unknown_ids_read_none():
    clock = Clock()
    config = EngineConfig(model="none", block_size=BLOCK, timelines_kept=3)
    limits = EngineLimits(BLOCK, 64, 128, 8, 256)
    engine = LLMEngine(config, CostRunner(clock), limits, vocab_size=100, clock=clock)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for i in range(6):
        engine.add_request([1, 2, 3, i], params, f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    assert [engine.timeline(f"r{i}") is not None for i in range(6)] == [False] * 3 + [True] * 3
    assert engine.timeline("nobody") is None


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(4, 72), st.integers(1, 16)),
        min_size=4,
        max_size=16,
    )
)
def test_removing_the_named_constraint_removes_its_reason(spec):
    arrivals, step = [], 0
    for gap, prompt, output in spec:
        step += gap
        arrivals.append(Arrival(step, prompt, output))
    seen = run(arrivals).reasons()
    total = sum(a.prompt + a.output for a in arrivals)
    roomy = {
        WaitReason.KV_BLOCKS_SHORT: Limits(num_kv_blocks=total // BLOCK + len(arrivals) + 8),
        WaitReason.MAX_NUM_SEQS: Limits(max_num_seqs=len(arrivals) + 1),
        WaitReason.PROMPT_BUDGET_SPENT: Limits(
            max_num_batched_tokens=total + 1, max_prefill_tokens=None
        ),
    }
    for reason, limits in roomy.items():
        if reason in seen:
            assert reason not in run(arrivals, limits).reasons(), reason


QUEUES: dict[str, QueueSpec] = {
    "fcfs": FcfsQueue(),
    "priority": PriorityQueue(preempt=True),
    "fair": FairQueue(),
}
EXPECTED = {
    "continuous": {WaitReason.KV_BLOCKS_SHORT, WaitReason.MAX_NUM_SEQS},
    "hybrid": {WaitReason.HYBRID_SINGLE, WaitReason.KV_BLOCKS_SHORT},
    "static": {WaitReason.GROUP_RUNNING},
    "dynamic": {WaitReason.GROUP_RUNNING},
}


@pytest.mark.parametrize("queue", QUEUES)
@pytest.mark.parametrize("policy", EXPECTED)
def test_every_policy_and_discipline_keeps_the_invariants(policy: str, queue: str):
    result = run(mixed_arrivals(40, seed=2), policy=policy, queue=QUEUES[queue])
    assert len(result.timelines) == 40
    for request_id, timeline in result.timelines.items():
        check_timeline(timeline, result.metrics[request_id])
    assert EXPECTED[policy] <= result.reasons(), result.reasons()
    causes = [e.cause for t in result.timelines.values() for e in t.events if e.cause]
    if queue == "priority" and policy in ("continuous", "hybrid"):
        assert PreemptCause.PRIORITY in causes
    assert sum(c.count for c in result.by_cause) == result.preemptions
    assert {c.cause: c.count for c in result.by_cause} == {
        cause: causes.count(cause) for cause in PreemptCause
    }


def test_a_burst_under_hybrid_waits_for_the_single_request_first():
    """Three requests under the depth threshold: one runs alone, the others wait for it."""
    result = run([Arrival(0, 16, 4)] * 3, Limits(num_kv_blocks=64), policy="hybrid")
    waits = [seg for t in result.timelines.values() for seg in t.segments if seg.reason is not None]
    held = {seg.first for seg in waits if seg.reason is WaitReason.HYBRID_SINGLE}
    assert held == {Hold(WaitReason.HYBRID_SINGLE, SeqsFull(1, 1))}


def test_each_fork_of_a_request_of_n_has_its_own_timeline():
    clock = Clock()
    limits = EngineLimits(BLOCK, 64, 128, 8, 256)
    engine = LLMEngine(
        EngineConfig(model="none", block_size=BLOCK),
        CostRunner(clock),
        limits,
        vocab_size=100,
        clock=clock,
    )
    engine.add_request(list(range(1, 40)), SamplingParams(n=3, max_tokens=3, ignore_eos=True), "r")
    metrics: dict[str, RequestMetrics] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                metrics[output.seq_id] = output.metrics
    timeline = engine.timeline("r")
    assert timeline is not None
    assert [fork.seq_id for fork in timeline.forks] == ["r#1", "r#2"]
    for one in (timeline, *timeline.forks):
        check_timeline(one, metrics[one.seq_id])
        assert sum(sum(s.chunks) for s in one.segments if s.phase is Phase.PREFILL) >= 39
    assert engine.timeline("r#2") == timeline.forks[1]


def test_the_snapshot_says_why_each_waiting_request_waits_and_where_the_waiting_went():
    clock = Clock()
    limits = Limits(num_kv_blocks=64, max_num_seqs=2)
    config = EngineConfig(model="none", block_size=BLOCK, max_num_seqs=2, max_waiting=64)
    engine_limits = EngineLimits(BLOCK, 64, 128, 2, 64)
    engine = LLMEngine(
        config,
        CostRunner(clock),
        engine_limits,
        vocab_size=100,
        clock=clock,
        policy=policy_spec("continuous", limits),
    )
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for i in range(8):
        engine.add_request([1 + i, 2, 3, 4], params, f"r{i}")
    engine.step()
    engine.step()
    snap = engine.snapshot()
    waiting = [r for r in snap.requests if r.state == "waiting"]
    assert len(waiting) == 6 and all(r.wait is not None for r in waiting)
    assert all(r.wait is None for r in snap.requests if r.state == "running")
    assert snap.waits is not None and snap.waits.head is not None
    head_hold = Hold(WaitReason.MAX_NUM_SEQS, SeqsFull(2, 2))
    assert snap.waits.head.hold == head_hold
    by_id = {r.id: r.wait for r in waiting}
    head = by_id.pop(snap.waits.head.seq_id)
    assert head is not None and head.reason is WaitReason.MAX_NUM_SEQS
    assert all(w is not None and w.reason is WaitReason.BEHIND_QUEUE for w in by_id.values())
    assert all(w is not None and w.hold == head_hold for w in by_id.values())
    assert sorted(w.ahead for w in by_id.values() if w is not None) == [1, 2, 3, 4, 5]
    while engine.has_unfinished_requests():
        engine.step()
    totals = engine.snapshot().waits
    assert totals is not None
    waited: dict[WaitReason, float] = {}
    for i in range(8):
        timeline = engine.timeline(f"r{i}")
        assert timeline is not None
        for reason, seconds in timeline.waited().items():
            waited[reason] = waited.get(reason, 0.0) + seconds
    assert {s.reason: pytest.approx(s.seconds) for s in totals.total} == waited
    assert totals.head is None and totals.recent == totals.total  # all within the window
    ttfts = {f"r{i}": t.ttft for i in range(8) if (t := engine.timeline(f"r{i}")) and t.ttft}
    assert totals.tail_ttft_s == percentile(list(ttfts.values()), 99)
    slowest = [engine.timeline(r) for r, ttft in ttfts.items() if ttft >= totals.tail_ttft_s]
    tail: dict[WaitReason, float] = {}
    for timeline in slowest:
        assert timeline is not None
        for reason, seconds in timeline.waited().items():
            tail[reason] = tail.get(reason, 0.0) + seconds
    assert {s.reason: pytest.approx(s.seconds) for s in totals.tail} == tail and tail


def test_aging_and_a_policy_switch_are_events_in_time_order():
    clock = Clock()
    config = EngineConfig(model="none", block_size=BLOCK, max_num_seqs=1, max_waiting=64)
    limits = EngineLimits(BLOCK, 64, 128, 1, 64)
    aging = {"name": "continuous", "params": {"max_wait_s": 0.01}}
    engine = LLMEngine(config, CostRunner(clock), limits, vocab_size=100, clock=clock, policy=aging)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for i in range(6):
        engine.add_request([1 + i, 2, 3, 4], params, f"r{i}")
    metrics: dict[str, RequestMetrics] = {}
    for step in itertools.count():
        if step == 8:
            engine.set_policy({"name": "hybrid", "params": {"max_wait_s": 0.01}}).result()
        for output in engine.step():
            if output.finished:
                metrics[output.seq_id] = output.metrics
        if not engine.has_unfinished_requests():
            break
    timelines = [engine.timeline(f"r{i}") for i in range(6)]
    switch_times = {
        e.time for t in timelines if t for e in t.events if e.kind is EventKind.POLICY_SWITCHED
    }
    assert len(switch_times) == 1
    [switched_at] = switch_times
    for timeline in timelines:
        assert timeline is not None
        check_timeline(timeline, metrics[timeline.seq_id])
        times = [e.time for e in timeline.events]
        assert times == sorted(times)
        admitted = [e.time for e in timeline.events if e.kind is EventKind.ADMITTED]
        aged = [e.time for e in timeline.events if e.kind is EventKind.AGED]
        bound = timeline.arrival_time + 0.01
        assert len(admitted) == 1 and aged == ([bound] if admitted[0] > bound else [])
        switches = [e for e in timeline.events if e.kind is EventKind.POLICY_SWITCHED]
        live = (metrics[timeline.seq_id].finish_time or 0) > switched_at
        assert [e.policy for e in switches] == (["hybrid"] if live else [])
    assert any(e.kind is EventKind.AGED for t in timelines if t for e in t.events)
