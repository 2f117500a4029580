"""Per-step records and rolling request statistics: the numbers the metrics, the console and
the benchmark all report.

Request latencies are defined once, by ``RequestMetrics`` (TTFT, TPOT, e2e, queue time), and
summarised once, by ``percentile`` and ``mean`` here: ``/admin/state`` (``latency``) and the
benchmark's report (``bench.metrics``) give the same figure for the same requests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kv_stats import ReclaimResult
from engine.outputs import RequestMetrics
from engine.timeline import CauseCount, PreemptCause

if TYPE_CHECKING:
    from engine.batch import ScheduledBatch

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class StepRecord:
    time: float
    wall_s: float
    forward_s: float
    mode: str
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    padded_tokens: int
    generated_tokens: int
    preempted: int
    kv_held_slots: int
    kv_live_tokens: int
    cpu_s: float = 0.0
    """The stepping thread's own CPU time in the step (``time.thread_time``): below ``wall_s``
    by what the thread waited for (the GIL, a core, the other intra-op threads) — with more
    intra-op threads it also counts their barrier's spinning, so it bounds the wait from
    below."""

    @classmethod
    def of(
        cls,
        batch: ScheduledBatch,
        counts: tuple[int, int, int],
        generated: int,
        time: float,
        wall_s: float,
        forward_s: float,
        cpu_s: float = 0.0,
    ) -> StepRecord:
        """The record of a step that ran ``batch``: ``counts`` are its (prefill, decode,
        padded) tokens (``ScheduledBatch.token_counts``), ``generated`` the tokens it kept."""
        prefill, decode, padded = counts
        return cls(
            time=time,
            wall_s=wall_s,
            forward_s=forward_s,
            mode=batch.mode,
            num_seqs=batch.num_seqs,
            prefill_tokens=prefill,
            decode_tokens=decode,
            padded_tokens=padded,
            generated_tokens=generated,
            preempted=len(batch.preempted),
            kv_held_slots=batch.kv_held_slots,
            kv_live_tokens=batch.kv_live_tokens,
            cpu_s=cpu_s,
        )


@dataclass(frozen=True, slots=True)
class FinishedRecord:
    time: float
    ttft: float | None
    tpot: float | None
    e2e: float | None
    output_tokens: int


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), interpolating linearly between the closest ranks:
    ``numpy.percentile``'s default, and vLLM's ``benchmark_serving``. None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class EngineStats:
    window_s: float = 10.0
    steps: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=8192))
    finished: deque[FinishedRecord] = field(default_factory=lambda: deque(maxlen=2048))
    reclaims: deque[tuple[float, ReclaimResult]] = field(default_factory=lambda: deque(maxlen=64))
    num_steps: int = 0
    seq_steps: int = 0
    """Σ sequences scheduled over all steps (the unit of the engine's per-step overhead)."""
    prompt_tokens: int = 0
    generation_tokens: int = 0
    padded_tokens: int = 0
    preemptions: int = 0
    preempted_by: dict[PreemptCause, int] = field(default_factory=dict)
    """``preemptions`` by cause (the policy's: memory, priority)."""
    requests_finished: int = 0
    wall_s: float = 0.0
    forward_s: float = 0.0
    cpu_s: float = 0.0
    """Σ the steps' ``StepRecord.cpu_s``: against ``wall_s``, what the stepping thread waited."""

    def record_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        self.num_steps += 1
        self.seq_steps += record.num_seqs
        self.prompt_tokens += record.prefill_tokens
        self.generation_tokens += record.generated_tokens
        self.padded_tokens += record.padded_tokens
        self.preemptions += record.preempted
        self.wall_s += record.wall_s
        self.forward_s += record.forward_s
        self.cpu_s += record.cpu_s

    def record_preemptions(self, causes: list[PreemptCause]) -> None:
        by = self.preempted_by
        for cause in causes:
            by[cause] = by.get(cause, 0) + 1

    def preemptions_by_cause(self) -> tuple[CauseCount, ...]:
        return CauseCount.summed(CauseCount(c, n) for c, n in self.preempted_by.items())

    def record_finish(self, metrics: RequestMetrics, output_tokens: int) -> None:
        self.requests_finished += 1
        self.finished.append(
            FinishedRecord(
                metrics.finish_time or 0.0, metrics.ttft, metrics.tpot, metrics.e2e, output_tokens
            )
        )

    def record_reclaim(self, now: float, result: ReclaimResult) -> None:
        self.reclaims.append((now, result))

    @property
    def engine_overhead(self) -> float:
        """Share of step wall time spent outside the model forward."""
        return (self.wall_s - self.forward_s) / self.wall_s if self.wall_s else 0.0

    def throughput(self, now: float) -> dict[str, float]:
        """Tokens per second over the last ``window_s`` seconds of steps."""
        since = now - self.window_s
        recent = [s for s in self.steps if s.time >= since]
        generated = sum(s.generated_tokens for s in recent)
        prompt = sum(s.prefill_tokens for s in recent)
        return {
            "output_tokens_per_s": generated / self.window_s,
            "prompt_tokens_per_s": prompt / self.window_s,
            "steps_per_s": len(recent) / self.window_s,
        }

    def latency(self, now: float, window_s: float = 60.0) -> dict[str, dict[str, float | None]]:
        since = now - window_s
        recent = [f for f in self.finished if f.time >= since]
        out: dict[str, dict[str, float | None]] = {}
        for name in ("ttft", "tpot", "e2e"):
            values = [v for f in recent if (v := getattr(f, name)) is not None]
            out[name] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
        return out
