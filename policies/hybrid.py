"""Hybrid: one request at a time while the queue is shallow, continuous batching when deep.

Below ``single_request_below`` (waiting + running) the oldest request runs alone: the lowest
latency a single request can get. At or above it the policy batches continuously, taking
prefills shortest-length-bucket first (``length_window`` wide, first-come within a bucket) so
short prompts are not stuck behind a very long one. The mode is decided every step.
Aging (``max_wait_s``) lets a long prompt that waited too long jump the length buckets.
Batched, a step's prefills beside decodes stay under ``max_prefill_tokens`` as in continuous;
alone, a request's prefill never shares a step with a decode, so only the token budget holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from pydantic import Field

from engine.batch import ScheduledBatch
from engine.sequence import Sequence, SequenceStatus
from engine.timeline import Hold, SeqsFull, WaitReason
from policies.continuous import ContinuousParams, ContinuousPolicy
from policies.json_types import JsonInt


class HybridParams(ContinuousParams):
    single_request_below: JsonInt = Field(
        4, ge=1, le=64, description="Run one request at a time below this queue depth."
    )
    length_window: JsonInt = Field(
        128, ge=1, le=1 << 20, description="Width of the prefill length buckets, in tokens."
    )


class HybridPolicy(ContinuousPolicy):
    name = "hybrid"
    params_model = HybridParams
    admits_in_queue_order = False  # by length bucket, or by arrival when single
    params: HybridParams

    @property
    def single_mode(self) -> bool:
        return self.queue_depth < self.params.single_request_below

    def _plan(self) -> ScheduledBatch:
        if self.single_mode:
            return self._schedule_single()
        batch = ScheduledBatch(mode="hybrid-batched")
        budget = self.token_budget
        # ``in_prefill`` read inline: these scans and the sort below touch every sequence
        for seq in [s for s in self.running if len(s.token_ids) - s.num_computed_tokens <= 1]:
            budget -= self._continue(batch, seq, budget)
        if batch.preempted:
            self._report(batch, self._held(batch, budget))
            return batch
        budget = self._prefill_room(budget)  # the step's prefills, running and admitted
        self._prompt_budget = budget
        running_prefills = [s for s in self.running if len(s.token_ids) - s.num_computed_tokens > 1]
        if budget <= 0 or not (running_prefills or self._may_admit(budget)):
            if running_prefills:
                batch.paused = self._spent(budget)
            self._report(batch, self._refused(budget))
            return batch  # nothing below could run or be admitted: skip sorting the queue
        running_prefills.sort(key=self._bucket)
        if self.discipline.preempts and self.waiting:
            displaced = self._displace(batch)
            if batch.preempted:
                self._report(batch, displaced or self._held(batch, budget))
                return batch
        admitting = self._admission_order(self.waiting, self._bucket)
        for seq in itertools.chain(running_prefills, admitting):
            if seq.status is SequenceStatus.RUNNING:
                took = self._continue(batch, seq, budget, may_preempt=False)
                if not took:  # no budget left, or no block to grow into
                    batch.paused = self._spent(budget) if budget <= 0 else self._dry()
                budget -= took
                continue
            used = self._try_admit(batch, seq, budget)
            if used is None:
                break
            budget -= used
        return batch

    def _bucket(self, seq: Sequence) -> tuple[int, float]:
        """Prefill order among equals: the length bucket, then arrival."""
        return (len(seq.token_ids) - seq.num_computed_tokens) // self.params.length_window, (
            seq.arrival_time
        )

    def _schedule_single(self) -> ScheduledBatch:
        """The oldest running sequence runs alone. Several run after a switch, a lowered cap or
        when the queue falls under the threshold: they finish one after another, oldest
        first, and nobody is admitted until none is left (a newcomer would take blocks while
        they hold theirs, and a dry pool preempts)."""
        batch = ScheduledBatch(mode="hybrid-single")
        alone = Hold(WaitReason.HYBRID_SINGLE, SeqsFull(len(self.running), 1))
        if self.running and self.discipline.preempts and self.waiting:
            displaced = self._displace(batch)  # the one running gives way to a lower priority
            if batch.preempted:
                self._report(batch, displaced or alone)
                return batch
        if self.running:
            for seq in sorted(self.running, key=lambda s: s.arrival_time):
                if self._continue(batch, seq, self.token_budget):
                    break
            batch.paused = alone
            self._report(batch, alone)
            return batch
        overdue = set(self._overdue(self.waiting))
        admitting = True  # an overdue sequence that does not fit blocks newer admissions
        for seq in self._admission_order(self.waiting, _arrival):
            if not admitting:
                break
            used = self._try_admit(batch, seq, self.token_budget)
            admitting = used is not None or seq not in overdue
            if used:
                break
        self._report(batch, Hold(WaitReason.HYBRID_SINGLE, SeqsFull(1, 1)))
        return batch

    def _first_order(self) -> Iterator[Sequence]:
        if self.single_mode:
            return self._admission_order(self.waiting, _arrival)
        return self._admission_order(self.waiting, self._bucket)

    @property
    def running_cap(self) -> int:
        return 1 if self.single_mode else super().running_cap

    @property
    def mode(self) -> str:
        return "single" if self.single_mode else "batched"


def _arrival(seq: Sequence) -> float:
    return seq.arrival_time
