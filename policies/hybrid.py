"""Hybrid: one request at a time while the queue is shallow, continuous batching when deep.

Below ``single_request_below`` (waiting + running) the oldest request runs alone: the lowest
latency a single request can get. At or above it the policy batches continuously, taking
prefills shortest-length-bucket first (``length_window`` wide, first-come within a bucket) so
short prompts are not stuck behind a very long one. The mode is decided every step.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from engine.batch import ScheduledBatch
from engine.sequence import Sequence, SequenceStatus
from policies.continuous import ContinuousParams, ContinuousPolicy


class HybridParams(ContinuousParams):
    single_request_below: int = Field(
        4, ge=1, le=64, description="Run one request at a time below this queue depth."
    )
    length_window: int = Field(
        128, ge=1, le=1 << 20, description="Width of the prefill length buckets, in tokens."
    )


class HybridPolicy(ContinuousPolicy):
    name = "hybrid"
    params_model = HybridParams
    params: HybridParams

    @property
    def single_mode(self) -> bool:
        return self.queue_depth < self.params.single_request_below

    def schedule(self) -> ScheduledBatch:
        if self.single_mode:
            return self._schedule_single()
        batch = ScheduledBatch(mode="hybrid-batched")
        budget = self.token_budget
        for seq in [s for s in self.running if not s.in_prefill]:
            budget -= self._continue(batch, seq, budget)
        if batch.preempted:
            return self._finish(batch)
        window = self.params.length_window
        prefills = [s for s in self.running if s.in_prefill] + list(self.waiting)
        prefills.sort(key=lambda s: (s.num_uncomputed_tokens // window, s.arrival_time))
        for seq in prefills:
            if seq.status is SequenceStatus.RUNNING:
                budget -= self._continue(batch, seq, budget, may_preempt=False)
                continue
            used = self._try_admit(batch, seq, budget)
            if used is None:
                break
            budget -= used
        return self._finish(batch)

    def _schedule_single(self) -> ScheduledBatch:
        batch = ScheduledBatch(mode="hybrid-single")
        candidates: list[Sequence] = sorted(
            [*self.running, *self.waiting], key=lambda s: s.arrival_time
        )
        for seq in candidates:
            if seq.status is SequenceStatus.RUNNING:
                used = self._continue(batch, seq, self.token_budget)
            else:
                used = self._try_admit(batch, seq, self.token_budget)
            if used:
                break
        return self._finish(batch)

    def snapshot(self) -> dict[str, Any]:
        snap = super().snapshot()
        snap["mode"] = "single" if self.single_mode else "batched"
        return snap
