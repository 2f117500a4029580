"""Drives ``LLMEngine`` in-process: requests go in at their arrival times, ``step()`` runs
until every request is done, and everything the metrics need is kept.

The model is loaded once; each run gets a fresh engine (its own KV pool, block manager and
policy) around it, so no run inherits another's cache. When the engine is empty and the next
request is not due yet, the clock skips ahead instead of sleeping: nothing happens while the
engine idles, so the timestamps are what a real wait would give, and a low-rate Poisson run
costs only its busy time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from bench.recording import EntryShape, RecordingRunner, StepTokens
from bench.workloads import Workload
from engine.builder import load_bundle
from engine.config import EngineConfig, as_dtype
from engine.errors import QueueFull, RequestRejected
from engine.front import QueuedPrompt
from engine.kv_stats import ReclaimResult
from engine.outputs import RequestMetrics
from engine.sampling_params import SamplingParams
from engine.stats import StepRecord
from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT
from policies.queue import QueueSpec
from serving.engine import LLMEngine
from serving.faults import leak_sequence

STALL_S = 30.0
"""A run whose engine makes no step for this long (wall time) is cut off and marked stalled."""


class SkipClock:
    """``perf_counter`` plus the idle time skipped so far."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.skipped

    def skip_to(self, when: float) -> None:
        self.skipped += max(0.0, when - self())


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """One run's engine: its policy and params, its KV pool in token slots, and the
    ``EngineConfig`` fields the run sets (``engine``, by field name). Every other knob keeps
    ``EngineConfig``'s default: the bench restates none of them."""

    policy: str
    policy_params: dict[str, Any] = field(default_factory=dict)
    kv_tokens: int = 32768
    engine: dict[str, Any] = field(default_factory=dict)
    queue: QueueSpec | None = None
    """The queue discipline (None: the engine's, first come first served)."""

    def config(self, model: str = "", **fixed: Any) -> EngineConfig:
        """The run's ``EngineConfig``, the pool sized to ``kv_tokens``; ``fixed`` are the
        factory's own fields (device, dtype, ...); ``model`` may stay a label."""
        config = EngineConfig(model=model, policy=self.policy, **fixed, **self.engine)
        return replace(config, num_kv_blocks=max(1, self.kv_tokens // config.block_size))


class EngineFactory:
    """One loaded model, fresh engines (KV pool, block manager, policy) around it."""

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: str = "float32") -> None:
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.dtype_name = dtype
        self.dtype = getattr(torch, dtype)
        self.bundle = load_bundle(
            EngineConfig(model=str(self.model_dir), device=device, dtype=as_dtype(dtype))
        )
        self.model_config = self.bundle.config
        self.tokenizer = self.bundle.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def kv_bytes_per_token(self) -> int:
        mc = self.model_config
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * element

    def build(
        self, settings: EngineSettings, clock: Callable[[], float], keep_shapes: bool = False
    ) -> tuple[LLMEngine, RecordingRunner]:
        # Every request of a burst is queued at once: the waiting queue must take them all.
        config = settings.config(
            str(self.model_dir), device=str(self.device), dtype=self.dtype_name, max_waiting=1 << 20
        )
        engine = LLMEngine.from_config(
            config,
            clock=clock,
            bundle=self.bundle,
            policy={"name": settings.policy, "params": settings.policy_params},
            queue=settings.queue,
        )
        recorder = RecordingRunner(engine.runner, keep_shapes=keep_shapes)
        engine.runner = recorder
        return engine, recorder


@dataclass(slots=True)
class RequestRecord:
    """One finished request: the bench's labels around the engine's own ``RequestMetrics``,
    which define TTFT, TPOT and e2e for the report as for ``/admin/state``."""

    index: int
    tag: str
    prompt_tokens: int
    metrics: RequestMetrics
    tenant: str = DEFAULT_TENANT
    priority: int = DEFAULT_PRIORITY

    @property
    def output_tokens(self) -> int:
        return len(self.metrics.token_times)

    @property
    def ttft(self) -> float | None:
        return self.metrics.ttft

    @property
    def tpot(self) -> float | None:
        return self.metrics.tpot

    @property
    def finish(self) -> float | None:
        return self.metrics.finish_time


@dataclass(slots=True)
class Hooks:
    """Maintenance experiments: leak some requests halfway, sweep every so often; fairness
    experiments: sample every tenant's service after each step."""

    leak: frozenset[int] = frozenset()
    reclaim_every_s: float | None = None
    watch_memory: bool = False
    watch_tenants: bool = False


@dataclass(frozen=True, slots=True)
class TenantSample:
    """One tenant's service so far and its requests not yet scheduled, after one step."""

    tenant: str
    input_tokens: int
    output_tokens: int
    queued: int


@dataclass
class RunTrace:
    """Everything one run leaves behind, times on the run's clock (``start`` = t0)."""

    requests: list[RequestRecord]
    steps: list[StepRecord]
    tokens: list[StepTokens]
    shapes: list[list[EntryShape]]
    start: float
    end: float
    idle_skipped_s: float
    instrument_s: float
    refused: int = 0
    leaked: int = 0
    stalled: bool = False
    reclaims: list[tuple[float, ReclaimResult]] = field(default_factory=list)
    leaked_tokens: list[int] = field(default_factory=list)
    """Per step (when leaking): tokens stored for leaked requests, counted as live by the
    engine although nobody will ever read them."""
    holding: list[int] = field(default_factory=list)
    """Per step (when watching memory): how many requests hold KV blocks."""
    bookkeeping_bytes: int = 0
    kv_bytes_at_peak: int = 0
    outputs: dict[int, list[int]] = field(default_factory=dict)
    tenants: list[tuple[float, tuple[TenantSample, ...]]] = field(default_factory=list)
    """Per step (when watching tenants): its end time and every tenant's sample."""


Advance = Callable[[int], None]
"""Told how many more requests are done (finished, refused or leaked)."""


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def drive(
    engine: LLMEngine,
    recorder: RecordingRunner,
    workload: Workload,
    hooks: Hooks | None = None,
    progress: Advance | None = None,
    kv_bytes_per_token: int = 0,
) -> RunTrace:
    hooks = hooks or Hooks()
    advance = progress or (lambda n: None)
    clock: Callable[[], float] = engine.clock
    skip = clock.skip_to if isinstance(clock, SkipClock) else None
    skipped_before = clock.skipped if isinstance(clock, SkipClock) else 0.0
    queue = deque(enumerate(workload.requests))
    index_of: dict[str, int] = {}
    to_leak = set(hooks.leak)
    leaked: set[str] = set()
    in_flight = 0
    records: list[RequestRecord] = []
    steps: list[StepRecord] = []
    trace = RunTrace(records, steps, recorder.tokens, recorder.shapes, 0.0, 0.0, 0.0, 0.0)

    def submit(index: int, arrival: float) -> None:
        nonlocal in_flight
        request = workload.requests[index]
        request_id = f"r{index}"
        try:
            prompt = QueuedPrompt(
                list(request.prompt),
                _params(request.max_tokens),
                request_id,
                request.priority,
                request.tenant,
            )
            engine.add_requests([prompt], arrival)
        except (QueueFull, RequestRejected):
            trace.refused += 1
            advance(1)
            return
        index_of[request_id] = index
        in_flight += 1

    start = clock()
    trace.start = start
    last_reclaim = time.perf_counter()
    last_progress = time.perf_counter()
    while queue or engine.has_unfinished_requests():
        now = clock()
        if workload.clients:
            while queue and in_flight < workload.clients:
                submit(queue.popleft()[0], now)
        else:
            while queue and start + queue[0][1].arrival <= now:
                index, request = queue.popleft()
                submit(index, start + request.arrival)
        if not engine.has_unfinished_requests():
            if queue and skip is not None and not workload.clients:
                skip(start + queue[0][1].arrival)
            elif queue and not workload.clients:
                time.sleep(max(0.0, start + queue[0][1].arrival - clock()))
            continue
        before = engine.stats.num_steps
        outputs = engine.step()
        if engine.stats.num_steps > before:
            steps.append(engine.stats.steps[-1])
            last_progress = time.perf_counter()
            if hooks.leak:
                trace.leaked_tokens.append(_leaked_tokens(engine, leaked))
            if hooks.watch_memory:
                _watch_memory(engine, trace, kv_bytes_per_token)
            if hooks.watch_tenants:
                trace.tenants.append((clock(), _tenant_samples(engine)))
        elif time.perf_counter() - last_progress > STALL_S:
            trace.stalled = True
            break
        for out in outputs:
            index = index_of[out.request_id]
            if out.finished:
                request = workload.requests[index]
                records.append(
                    RequestRecord(
                        index,
                        request.tag,
                        len(request.prompt),
                        out.metrics,
                        request.tenant,
                        request.priority,
                    )
                )
                trace.outputs[index] = out.token_ids
                in_flight -= 1
                advance(1)
            elif index in to_leak and len(out.token_ids) * 2 >= workload.requests[index].max_tokens:
                leak_sequence(engine, out.request_id).result()
                to_leak.discard(index)
                leaked.add(out.request_id)
                trace.leaked += 1
                in_flight -= 1
                advance(1)
        if hooks.reclaim_every_s and time.perf_counter() - last_reclaim >= hooks.reclaim_every_s:
            trace.reclaims.append((clock(), engine.reclaim().result()))
            last_reclaim = time.perf_counter()
    trace.end = max((r.finish for r in records if r.finish is not None), default=clock())
    trace.idle_skipped_s = (clock.skipped if isinstance(clock, SkipClock) else 0.0) - skipped_before
    trace.instrument_s = recorder.instrument_s
    return trace


def _tenant_samples(engine: LLMEngine) -> tuple[TenantSample, ...]:
    return tuple(
        TenantSample(a.name, a.input_tokens, a.output_tokens, a.queued)
        for a in engine.tenants.accounts()
    )


def _leaked_tokens(engine: LLMEngine, leaked: set[str]) -> int:
    """Tokens still stored for leaked requests (until a sweep frees their blocks)."""
    return sum(engine.blocks.stored_tokens(r) for r in leaked)


def _watch_memory(engine: LLMEngine, trace: RunTrace, kv_bytes_per_token: int) -> None:
    """Count the requests holding KV, and keep the block manager's own footprint at the step
    where it holds the most KV."""
    trace.holding.append(len(engine.blocks.holders()))
    held_bytes = engine.blocks.num_used * engine.blocks.block_size * kv_bytes_per_token
    if held_bytes > trace.kv_bytes_at_peak * 1.05:
        trace.kv_bytes_at_peak = held_bytes
        trace.bookkeeping_bytes = deep_size(engine.blocks)


def deep_size(obj: object) -> int:
    """Bytes of Python objects reachable from ``obj`` (each counted once), tensors excluded."""
    import sys

    seen: set[int] = set()
    stack = [obj]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, torch.Tensor | type):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset | deque):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.append(vars(item))
        elif hasattr(item, "__slots__"):
            stack.extend(getattr(item, s) for s in item.__slots__ if hasattr(item, s))
    return total
