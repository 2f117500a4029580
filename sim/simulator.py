"""``simulate()``: the real ``LLMEngine`` (its policy from the registry, its ``BlockManager``)
driven by a virtual clock and a cost-model runner over a trace.

Arrivals are fed as the clock reaches them, never all up front: after each step every request
whose ``arrived_at`` has passed is added with its own arrival time, and an idle engine jumps
the clock to the next arrival. Prompts are placeholder token ids unique to each request (the
first ``shared_prefix`` tokens are common to all requests), so the prefix cache shares only
what the trace says is shared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineConfig, EngineLimits, config_default
from engine.errors import QueueFull, RequestRejected
from engine.front import QueuedPrompt
from engine.outputs import RequestMetrics
from engine.runner import Runner
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats, StepRecord
from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT
from engine.timeline import HeldShare
from policies.queue import QueueSpec
from policies.spec import PolicySpec
from serving.engine import LLMEngine
from sim.clock import VirtualClock
from sim.cost_model import CostModel
from sim.runner import CostModelRunner
from sim.trace import TraceRequest

SHARED_TOKEN = 7
UNIQUE_BASE = 1_000_000
"""Placeholder ids: shared prefix tokens are ``SHARED_TOKEN``; request ``i``'s own tokens are
``UNIQUE_BASE + i`` (the block hash chains on its parent, so one id per request suffices)."""
IDLE_TICK_S = 1e-3
"""A step that schedules nothing while requests wait (a policy waiting on its own timer)
moves the clock on by this much."""
MAX_IDLE_TICKS = 10**6


@dataclass(frozen=True, slots=True)
class SimSetup:
    """The engine knobs of a simulated run; ``None`` where EngineConfig's default means "from
    the model / machine": ``num_kv_blocks`` from the cost model, ``max_model_len`` from the
    cost model's ``max_model_len`` (if it has one) or else the trace's longest request."""

    block_size: int = config_default("block_size")
    max_num_seqs: int = config_default("max_num_seqs")
    max_num_batched_tokens: int = config_default("max_num_batched_tokens")
    memory_reserve: float = config_default("memory_reserve")
    max_model_len: int | None = config_default("max_model_len")
    num_kv_blocks: int | None = config_default("num_kv_blocks")
    enable_prefix_caching: bool = config_default("enable_prefix_caching")
    max_waiting: int = 1 << 20
    """Not EngineConfig's 1,024: a replay measures the scheduler, not the admission limit (a
    burst of 10,000 is queued whole, as ``servedeck bench`` queues its bursts)."""


@dataclass(slots=True)
class SimRecord:
    """One finished request: its trace index, token counts and the engine's own metrics."""

    index: int
    prompt_tokens: int
    output_tokens: int
    metrics: RequestMetrics
    finish_reason: str | None = None
    tenant: str = DEFAULT_TENANT
    priority: int = DEFAULT_PRIORITY

    @property
    def ttft(self) -> float | None:
        return self.metrics.ttft

    @property
    def tpot(self) -> float | None:
        return self.metrics.tpot


@dataclass(slots=True)
class SimResult:
    records: list[SimRecord]
    stats: EngineStats
    duration_s: float
    """From the first arrival to the last finish, in simulated seconds."""
    steps: list[StepRecord] = field(default_factory=list)
    """Every step (``stats.steps`` keeps only the newest)."""
    num_kv_blocks: int = 0
    block_size: int = 0
    refused: int = 0
    busy_s: float = 0.0
    cost_model: str = ""
    policy: PolicySpec | None = None
    engine: LLMEngine | None = None
    """The engine that ran (its policy, block manager and stats, for inspection)."""
    waits: tuple[HeldShare, ...] = ()
    """The run's waiting seconds by what held the queue's head, the engine's own recorder
    (``WaitSummary.total``), read once at the end; ``HeldShare.fractions`` gives the shares."""


def _prompt(index: int, request: TraceRequest) -> list[int]:
    own = request.num_prefill_tokens - request.shared_prefix
    return [SHARED_TOKEN] * request.shared_prefix + [UNIQUE_BASE + index] * own


def build_engine(
    cost_model: CostModel,
    policy: PolicySpec | str | dict[str, Any],
    setup: SimSetup,
    max_model_len: int,
    queue: QueueSpec | None = None,
) -> tuple[LLMEngine, VirtualClock, CostModelRunner]:
    """The engine the server would build, with a virtual clock and the cost-model runner."""
    num_blocks = setup.num_kv_blocks or cost_model.kv_cache_blocks(setup.block_size)
    if not num_blocks:
        raise ValueError(f"{cost_model.name} sizes no KV pool: give SimSetup.num_kv_blocks")
    config = EngineConfig(
        model=f"sim:{cost_model.name}",
        block_size=setup.block_size,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        memory_reserve=setup.memory_reserve,
        enable_prefix_caching=setup.enable_prefix_caching,
        max_waiting=setup.max_waiting,
    )
    limits = EngineLimits(
        setup.block_size,
        num_blocks,
        max_model_len,
        setup.max_num_seqs,
        setup.max_num_batched_tokens,
    )
    clock = VirtualClock()
    runner = CostModelRunner(cost_model, clock)
    engine = LLMEngine(config, runner, limits, clock=clock, policy=policy, queue=queue)
    return engine, clock, runner


class _Arrivals:
    """The trace in arrival order; hands out the requests whose time has come."""

    def __init__(self, requests: Sequence[TraceRequest]) -> None:
        self.requests = requests
        self.order = sorted(range(len(requests)), key=lambda i: requests[i].arrived_at)
        self.pos = 0

    @property
    def pending(self) -> bool:
        return self.pos < len(self.order)

    @property
    def next_time(self) -> float:
        return self.requests[self.order[self.pos]].arrived_at

    def due(self, now: float) -> Iterator[tuple[int, TraceRequest]]:
        while self.pending and self.next_time <= now:
            index = self.order[self.pos]
            self.pos += 1
            yield index, self.requests[index]


def simulate(
    requests: Sequence[TraceRequest],
    cost_model: CostModel,
    policy: PolicySpec | str | dict[str, Any],
    setup: SimSetup | None = None,
    wrap_runner: Callable[[Runner], Runner] | None = None,
    queue: QueueSpec | None = None,
) -> SimResult:
    """Run the trace to completion; ``wrap_runner`` may wrap the cost-model runner (the bench
    wraps it in its ``RecordingRunner`` to note each step's padding); ``queue`` is the queue
    discipline (None: first come, first served), each request's tenant and priority the
    trace's."""
    setup = setup or SimSetup()
    max_len = setup.max_model_len or getattr(cost_model, "max_model_len", None)
    if not max_len:
        max_len = max((r.num_prefill_tokens + r.num_decode_tokens for r in requests), default=2)
    engine, clock, runner = build_engine(cost_model, policy, setup, max_len, queue)
    if wrap_runner is not None:
        engine.runner = wrap_runner(runner)
    result = SimResult(
        [],
        engine.stats,
        0.0,
        num_kv_blocks=engine.front.limits.num_kv_blocks,
        block_size=setup.block_size,
        cost_model=cost_model.name,
        policy=engine.policy_spec,
        engine=engine,
    )
    arrivals = _Arrivals(requests)
    if arrivals.pending:
        clock.advance_to(arrivals.next_time)
    start = clock()
    idle = 0
    while arrivals.pending or engine.has_unfinished_requests():
        now = clock()
        for i, r in arrivals.due(now):
            params = SamplingParams(
                max_tokens=r.num_decode_tokens, temperature=0.0, ignore_eos=True
            )
            prompt = QueuedPrompt(_prompt(i, r), params, f"r{i}", r.priority, r.tenant)
            try:
                engine.add_requests([prompt], r.arrived_at)
            except (QueueFull, RequestRejected):
                result.refused += 1
        if not engine.has_unfinished_requests():
            if arrivals.pending:
                clock.advance_to(arrivals.next_time)
            continue
        before = engine.stats.num_steps
        outputs = engine.step()
        if engine.stats.num_steps > before:
            result.steps.append(engine.stats.steps[-1])
            idle = 0
        elif not outputs:  # a policy waiting on its own timer: let time pass
            idle += 1
            if idle > MAX_IDLE_TICKS:
                raise RuntimeError(
                    f"{engine.policy_spec.name} schedules nothing while requests wait"
                )
            later = arrivals.next_time if arrivals.pending else now + IDLE_TICK_S
            clock.advance_to(min(later, now + IDLE_TICK_S))
        for out in outputs:
            if out.finished:
                i = int(out.request_id.removeprefix("r"))
                result.records.append(
                    SimRecord(
                        i,
                        requests[i].num_prefill_tokens,
                        len(out.metrics.token_times),
                        out.metrics,
                        out.finish_reason,
                        requests[i].tenant,
                        requests[i].priority,
                    )
                )
    ends = [r.metrics.finish_time for r in result.records if r.metrics.finish_time is not None]
    result.duration_s = max(ends, default=start) - start
    result.busy_s = runner.busy_s
    result.waits = engine.timelines.summary(clock()).total
    return result
