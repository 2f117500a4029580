"""Padded-group batching, shared by the static and dynamic policies.

A group is padded to its longest prompt and reserves KV for ``padded_len + max_tokens`` per
row up front. Its prefill really computes the padded positions (their K/V land in the row's
reserved slots past its real tokens, never in its logical positions), and every row keeps
computing until the group's longest request is done: the cost of padding is real. Each
request's output is still released at its own finish; its blocks are held until the group
ends. Groups run one after another; arrivals wait for the running group. With aging on
(``max_wait_s``), overdue requests, oldest first, form the next group(s) ahead of the rest.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterator

from pydantic import Field

from engine.batch import ScheduledBatch
from engine.config import EngineLimits
from engine.kv_cache import BlockManager
from engine.sequence import Sequence, SequenceStatus
from engine.timeline import Hold, PreemptCause, QueueHead, SeqsFull, TokenBudget, WaitReason
from policies.base import PolicyParams, SchedulingPolicy
from policies.discipline import QueueDiscipline
from policies.snapshot import PolicySnapshot
from policies.waiting import WaitingQueue


class GroupSnapshot(PolicySnapshot):
    """Static and dynamic batching: the padded group in flight."""

    group_size: int = Field(description="Rows of the group in flight.")
    group_finished_rows: int = Field(description="Its rows already finished (still held).")
    groups_started: int = Field(description="Groups started so far.")


class GroupParams(PolicyParams):
    """What every padded-group policy's params hold (each declares its own default and text)."""

    max_batch_size: int


class PaddedGroupPolicy(SchedulingPolicy):
    admits_in_queue_order = False  # the queued groups first

    def __init__(
        self,
        params: GroupParams,
        limits: EngineLimits,
        blocks: BlockManager,
        clock: Callable[[], float],
        discipline: QueueDiscipline | None = None,
    ) -> None:
        super().__init__(params, limits, blocks, clock, discipline)
        self.group: list[Sequence] = []
        self.queued_groups: deque[list[Sequence]] = deque()
        self.max_batch_size = min(params.max_batch_size, limits.max_num_seqs)
        self.token_budget = limits.max_num_batched_tokens
        self.groups_started = 0
        self._blocked: QueueHead | None = None
        """The row of the next group that found too few blocks in this step (if any)."""
        self._last_group_hold: tuple[int, Hold] | None = None

    @abstractmethod
    def _form_groups(self) -> list[list[Sequence]]:
        """Take sequences off ``self.waiting`` and cut them into groups, in run order."""

    def _take_waiting(self, count: int) -> list[Sequence]:
        """The first ``count`` waiting sequences in the discipline's order, taken off the queue."""
        taken = list(itertools.islice(self.discipline.order(self.waiting), count))
        chosen = {id(s) for s in taken}
        self.waiting = WaitingQueue(s for s in self.waiting if id(s) not in chosen)
        return taken

    # -- interface ----------------------------------------------------------------------

    def _plan(self) -> ScheduledBatch:
        batch = ScheduledBatch(mode=self.name)
        self._blocked = None
        if not self.running:
            self._end_group()
            self._start_next_group()
        prefill_rows = [s for s in self.running if len(s.token_ids) - s.num_computed_tokens > 1]
        if prefill_rows:
            batch.mode = f"{self.name}-prefill"
            self._schedule_prefill(batch, prefill_rows)
        else:
            batch.mode = f"{self.name}-decode"
            for seq in list(self.group):
                if seq.status is SequenceStatus.FINISHED:  # ``is_finished``, once per row
                    self._schedule(batch, seq, 0, 1)
                elif seq.status is SequenceStatus.RUNNING and self._reserve_slots(seq, 1, batch):
                    self._schedule(batch, seq, 1)
        if self._blocked is not None:
            batch.waiting_on = self._blocked
        elif self.running:
            self._report(batch, self._group_hold())
        return batch

    def _group_hold(self) -> Hold:
        """The group in flight holds the queue: its rows still running, against
        ``max_batch_size`` (the last one again while the count is unchanged)."""
        running = len(self.running)
        if (last := self._last_group_hold) is None or last[0] != running:
            hold = Hold(WaitReason.GROUP_RUNNING, SeqsFull(running, self.max_batch_size))
            last = self._last_group_hold = (running, hold)
        return last[1]

    def _queue_head(self) -> Sequence | None:
        for group in self.queued_groups:
            if group:
                return group[0]
        return super()._queue_head()

    def _first_order(self) -> Iterator[Sequence]:
        return itertools.chain(self.live_queued(), super()._first_order())

    def on_step_done(self, batch: ScheduledBatch, finished: list[Sequence]) -> None:
        """Finished rows stay in the group, blocks held, until its longest row is done."""
        for seq in finished:
            if seq in self.running:
                self.running.remove(seq)
        if not self.running:
            self._end_group()

    def abort(self, seq_id: str) -> Sequence | None:
        seq = super().abort(seq_id)
        if seq is None:
            for group in self.queued_groups:
                for queued in group:
                    if queued.seq_id == seq_id:
                        group.remove(queued)
                        return queued
            return None
        if seq in self.group:
            self.group.remove(seq)
        return seq

    def handover(self) -> list[Sequence]:
        """Unfinished rows keep their (padded) reservation; finished rows free theirs now."""
        queued = [s for group in self.queued_groups for s in group]
        self.queued_groups.clear()
        for seq in self.group:
            if seq.is_finished:
                self.blocks.free(seq.seq_id)
        self.group = []
        running = [s for s in self.running if not s.is_finished]
        waiting = list(self.waiting)
        self.running.clear()
        self.waiting.clear()
        return running + queued + waiting

    def adopt(self, seqs: list[Sequence]) -> None:
        """Sequences that hold blocks join the running group (after a handover the group is
        empty: they become it), run to completion first. The engine adopts a request's
        forked sequences (``n`` > 1) mid-group this way; the group's finished rows stay."""
        super().adopt(seqs)
        grouped = {id(s) for s in self.group}
        self.group += [s for s in self.running if id(s) not in grouped]

    def live_ids(self) -> set[str]:
        ids = super().live_ids() | {s.seq_id for s in self.group}
        return ids | {s.seq_id for group in self.queued_groups for s in group}

    def snapshot(self) -> GroupSnapshot:
        queued = self.live_queued()
        return GroupSnapshot(
            policy=self.name,
            params=self.params.effective(self.limits),
            waiting=len(self.waiting) + len(queued),
            running=len(self.running),
            preemptions=self.num_preemptions,
            overdue=len(self._overdue([*self.waiting, *queued])),
            mode=self.mode,
            draining_to=self.draining_to,
            group_size=len(self.group),
            group_finished_rows=sum(1 for s in self.group if s.is_finished),
            groups_started=self.groups_started,
        )

    @property
    def queue_depth(self) -> int:
        return super().queue_depth + sum(len(g) for g in self.queued_groups)

    @property
    def running_cap(self) -> int:
        """An adopted group larger than ``max_batch_size`` runs to completion; the next
        group starts only when it is done (and is cut to the new size)."""
        return self.max_batch_size

    def live_queued(self) -> list[Sequence]:
        """Sequences drained from the queue into groups that have not started yet."""
        return [s for group in self.queued_groups for s in group]

    # -- internals ----------------------------------------------------------------------

    def _preempt(
        self, seq: Sequence, batch: ScheduledBatch, cause: PreemptCause = PreemptCause.MEMORY
    ) -> None:
        super()._preempt(seq, batch, cause)
        if seq in self.group:
            self.group.remove(seq)

    def _schedule_prefill(self, batch: ScheduledBatch, rows: list[Sequence]) -> None:
        """Prefill the group's rows, each padded to the longest, in sub-batches that fit the
        token budget (a row longer than the budget runs alone)."""
        padded_len = max(s.num_tokens for s in rows)
        budget = self.token_budget
        for seq in rows:
            if seq.status is not SequenceStatus.RUNNING:
                continue
            cost = padded_len - seq.num_computed_tokens
            if batch.entries and cost > budget:
                figures = TokenBudget(budget, self.token_budget, cost)
                batch.paused = Hold(WaitReason.PROMPT_BUDGET_SPENT, figures)
                break
            pads = padded_len - seq.num_tokens
            if not self.changes.grow(seq.seq_id, seq.num_tokens, padded_len):
                pads = 0  # an adopted row without room for padding computes unpadded
            if self._reserve_slots(seq, seq.num_uncomputed_tokens, batch):
                self._schedule(batch, seq, seq.num_uncomputed_tokens, pads)
                budget -= cost

    def _end_group(self) -> None:
        for seq in self.group:
            self.blocks.free(seq.seq_id)
        self.group = []

    def _promote_overdue(self) -> None:
        """Aging: overdue sequences (oldest first) are taken out of the queue and the queued
        groups and made the next groups; they start as soon as the group in flight is done."""
        queued = self.live_queued()
        overdue = self._overdue([*queued, *self.waiting])
        if not overdue or queued[: len(overdue)] == overdue:
            return
        late = set(overdue)
        rest = [[s for s in group if s not in late] for group in self.queued_groups]
        self.waiting = WaitingQueue(s for s in self.waiting if s not in late)
        size = self.max_batch_size
        heads = [overdue[i : i + size] for i in range(0, len(overdue), size)]
        self.queued_groups = deque([*heads, *(group for group in rest if group)])

    def _start_next_group(self) -> None:
        while not self.running:
            self._promote_overdue()
            if not self.queued_groups:
                self.queued_groups.extend(g for g in self._form_groups() if g)
                if not self.queued_groups:
                    return
            rows = self.queued_groups.popleft()
            taken = self._admit_group(rows)
            if len(taken) < len(rows):
                self.queued_groups.appendleft(rows[len(taken) :])
            if not taken:
                return  # not even one row fits yet: wait for blocks
            self.group = taken
            self.running = list(taken)
            self.groups_started += 1

    def _admit_group(self, rows: list[Sequence]) -> list[Sequence]:
        padded_len = max(s.num_tokens for s in rows)
        taken: list[Sequence] = []
        for seq in rows:
            hits = self._prefix_hits(seq)
            remaining = seq.params.max_tokens - seq.num_output_tokens
            hold = min(padded_len + remaining, self.limits.max_model_len)
            fallbacks = [hold] if taken else [hold, padded_len, seq.num_tokens]
            fit = next((h for h in fallbacks if self.blocks.can_admit(hits, h)), None)
            if fit is None:
                self._blocked = QueueHead(seq, self._short(hits, seq, fallbacks[-1]))
                break
            self._admit(seq, fit, hits)
            taken.append(seq)
        return taken
