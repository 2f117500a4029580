"""Iteration-level scheduling (Orca / vLLM): the batch is rebuilt after every step.

Running sequences go first (decodes, then unfinished prefill chunks) under the token budget;
waiting ones join while ``max_num_seqs``, the budget and the blocks above the reserve allow.
With chunked prefill a long prompt takes the budget in pieces, so running decodes never stall
behind it. When the pool runs dry the newest running sequence is preempted (recompute).

Stall-free batching (Sarathi-Serve): a step that carries decodes takes at most
``max_prefill_tokens`` prefill tokens beside them (running chunks and admissions together), so
a decode step is never stretched by a full-budget prefill chunk. A step without decodes has no
stream to protect: its prefill takes the whole token budget (a cap there would only split the
same prefill into more, slower steps). With ``adaptive_prefill`` the cap follows the decodes
running: near the whole budget beside a few, down to ``max_prefill_tokens`` as they fill the
batch (prompts waiting behind a handful of decodes prefill in a few large steps, as vLLM's
2,048-token steps do, while a full batch of streams keeps its short steps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field

from engine.batch import ScheduledBatch
from engine.config import EngineLimits
from engine.kv_cache import BlockManager
from engine.kv_step import StepChanges
from engine.sequence import Sequence, SequenceStatus
from engine.timeline import (
    BlocksShort,
    Hold,
    PreemptCause,
    SeqsFull,
    TokenBudget,
    WaitReason,
)
from policies.base import (
    DEFAULT_MAX_WAIT_S,
    MaxBatchedTokens,
    MaxNumSeqs,
    PolicyParams,
    SchedulingPolicy,
    max_wait_field,
)
from policies.discipline import QueueDiscipline
from policies.json_types import JsonBool, JsonIntOrNull, JsonNumberOrNull

DEFAULT_MAX_PREFILL_TOKENS: int | None = 256
"""Chosen from the curve (bench/prefill_budget.py; docs/benchmarks.md, "Prefill budget") on the
`small` CPU burst of 100 requests: the smallest budget that kept >= 90 % of the 2,048 row's
output tok/s in both rounds (91-96 %), with TPOT p99 about 4x lower (~125 vs ~480 ms) at a TTFT
p99 about 30 % higher. null restores the step budget alone."""


class ContinuousParams(PolicyParams):
    caps: ClassVar[dict[str, str]] = {
        "max_num_seqs": "max_num_seqs",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "max_prefill_tokens": "max_num_batched_tokens",
    }
    max_num_seqs: JsonIntOrNull = MaxNumSeqs
    max_num_batched_tokens: JsonIntOrNull = MaxBatchedTokens
    enable_chunked_prefill: JsonBool = Field(
        True, description="Split long prompts across steps so decodes keep running."
    )
    max_prefill_tokens: JsonIntOrNull = Field(
        DEFAULT_MAX_PREFILL_TOKENS,
        ge=1,
        le=1 << 20,
        description=(
            "Prefill tokens (prompt chunks, admissions included) one step may carry beside "
            "running decodes; decodes are scheduled first. A step without decodes takes the "
            "whole token budget. null: no separate cap (the step's token budget only)."
        ),
        json_schema_extra={"x-null": "step budget"},
    )
    adaptive_prefill: JsonBool = Field(
        False,
        description=(
            "max_prefill_tokens' mode. false: a fixed cap beside decodes. true: the cap adapts "
            "to the decodes running: beside D of them a step may take up to max(max_prefill_"
            "tokens, B - D x (B - max_prefill_tokens) / N) prefill tokens (B the step's token "
            "budget, N max_num_seqs or B if smaller): the whole budget while few decode, "
            "max_prefill_tokens once the batch is full of decodes."
        ),
    )
    max_wait_s: JsonNumberOrNull = max_wait_field(DEFAULT_MAX_WAIT_S)

    def effective(self, limits: EngineLimits) -> dict[str, Any]:
        """The prefill cap in force: never above the step budget (the policy's own), which a
        ``null`` cap stands for and the default may exceed under a small engine cap."""
        params = super().effective(limits)
        budget = params["max_num_batched_tokens"]
        params["max_prefill_tokens"] = min(self.max_prefill_tokens or budget, budget)
        return params


class ContinuousPolicy(SchedulingPolicy):
    name = "continuous"
    params_model = ContinuousParams
    params: ContinuousParams

    def __init__(
        self,
        params: ContinuousParams,
        limits: EngineLimits,
        blocks: BlockManager,
        clock: Callable[[], float],
        discipline: QueueDiscipline | None = None,
    ) -> None:
        super().__init__(params, limits, blocks, clock, discipline)
        self.max_num_seqs = params.max_num_seqs or limits.max_num_seqs
        self.token_budget = params.max_num_batched_tokens or limits.max_num_batched_tokens
        self.prefill_cap = min(params.max_prefill_tokens or self.token_budget, self.token_budget)
        self._prompt_budget = self.token_budget
        """The prompt tokens the step in planning could carry (``TokenBudget.budget``)."""
        self._last_refusal: tuple[tuple[int, int, int], Hold] | None = None
        """``_refused``'s last answer, by (running, room, prompt budget): most steps repeat it."""

    @property
    def running_cap(self) -> int:
        """``max_num_seqs``, or the token budget when smaller: every running sequence takes at
        least one token of a step, and admission needs budget left after all of them."""
        return min(self.max_num_seqs, self.token_budget)

    def adopt(self, seqs: list[Sequence]) -> None:
        super().adopt(seqs)
        for seq in self.running:
            self.blocks.trim(seq.seq_id, seq.num_tokens)

    def schedule(self, changes: StepChanges) -> ScheduledBatch:
        batch = super().schedule(changes)
        if (head := batch.waiting_on) is not None:
            # the sequence refused first is the queue's head until the queue changes again
            waiting = self.waiting
            self._head = (id(waiting), waiting.version, head.seq)
        return batch

    def _plan(self) -> ScheduledBatch:
        batch = ScheduledBatch(mode=self.name)
        budget = self.token_budget
        # ``in_prefill`` read inline: this split touches every running sequence each step
        prefills = [s for s in self.running if len(s.token_ids) - s.num_computed_tokens > 1]
        for seq in [s for s in self.running if len(s.token_ids) - s.num_computed_tokens <= 1]:
            budget -= self._continue(batch, seq, budget)
        room = self._prefill_room(budget)
        self._prompt_budget = room
        for seq in prefills:
            room -= self._continue(batch, seq, room)
        if room <= 0 and prefills:
            batch.paused = self._spent(room)
        displaced = None
        if self.discipline.preempts and self.waiting and not batch.preempted:
            displaced = self._displace(batch)
        if not batch.preempted and self._may_admit(room):
            for seq in self._admission_order(self.waiting):
                used = self._try_admit(batch, seq, room)
                if used is None:
                    break
                room -= used
        elif self.waiting:
            self._report(batch, displaced or self._held(batch, room))
        return batch

    def _held(self, batch: ScheduledBatch, room: int) -> Hold:
        """What kept the step from admitting anyone: a preemption for want of blocks (no
        admission follows it in the same step), the sequence cap, or the spent budget."""
        return self._dry() if batch.preempted else self._refused(room)

    def _dry(self) -> Hold:
        """The pool had no block for a running sequence's next tokens."""
        blocks = self.blocks
        return Hold(
            WaitReason.KV_BLOCKS_SHORT, BlocksShort(None, blocks.admissible, blocks.reserved)
        )

    def _refused(self, room: int) -> Hold:
        """The cap or the budget that refuses the next admission (``_may_admit``'s checks)."""
        running, cap = len(self.running), self.max_num_seqs
        key = (running, room, self._prompt_budget)
        if (last := self._last_refusal) is not None and last[0] == key:
            return last[1]
        hold = self._refusal(running, cap, room)
        self._last_refusal = (key, hold)
        return hold

    def _refusal(self, running: int, cap: int, room: int) -> Hold:
        if running > cap:
            return Hold(WaitReason.DRAINING_CAP, SeqsFull(running, cap))
        if running >= cap:
            return Hold(WaitReason.MAX_NUM_SEQS, SeqsFull(running, cap))
        return self._spent(room)

    def _spent(self, room: int) -> Hold:
        """The step's prompt tokens are spent: ``room`` left of ``_prompt_budget``."""
        return Hold(WaitReason.PROMPT_BUDGET_SPENT, TokenBudget(room, self._prompt_budget))

    def _displace(self, batch: ScheduledBatch) -> Hold | None:
        """Priority preemption: when the best waiting sequence cannot be admitted (the batch is
        full, or the pool cannot hold its prompt), one running sequence of a higher priority
        value (the discipline's victim among them) is preempted. The waiting one is admitted
        at the next step: an admission never follows a preemption in the same step."""
        head = min(self.waiting, key=lambda s: s.priority)
        full = len(self.running) >= self.running_cap
        hits = [] if full else self._prefix_hits(head)
        if not full and self.blocks.can_admit(hits, head.num_tokens):
            return None
        below = [s for s in self.running if self.discipline.displaces(head, s)]
        if not below:
            return None
        hold = self._refused(1) if full else self._short(hits, head)
        self._preempt(self.discipline.victim(below), batch, PreemptCause.PRIORITY)
        return hold

    def _prefill_room(self, budget: int) -> int:
        """Prefill tokens the step may still take once its decodes are scheduled with
        ``budget`` left: at most ``prefill_cap`` beside decodes (``adaptive_prefill``: a cap
        from the whole budget down to ``prefill_cap`` as decodes fill the batch), the whole
        rest without."""
        if budget >= self.token_budget:
            return budget
        cap = self.prefill_cap
        if self.params.adaptive_prefill:
            decodes = self.token_budget - budget  # one token each
            spare = self.token_budget - cap
            cap = max(cap, self.token_budget - decodes * spare // self.running_cap)
        return min(budget, cap)

    def _continue(
        self, batch: ScheduledBatch, seq: Sequence, budget: int, may_preempt: bool = True
    ) -> int:
        """Schedule a running sequence's next chunk or decode; returns the tokens it takes.

        A running sequence continues in chunks even with ``enable_chunked_prefill`` off: that
        switch governs admission (which then takes a whole prompt at once), so the only running
        prefills are adopted ones (a switch, a lowered budget), and holding one back until its
        rest fits the step could stall it, blocks held, for good."""
        if budget <= 0 or seq.status is not SequenceStatus.RUNNING:
            return 0  # out of budget, or preempted earlier in this step
        num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
        if not self._reserve_slots(seq, num_new, batch, may_preempt):
            return 0
        self._schedule(batch, seq, num_new)
        return num_new

    def _may_admit(self, budget: int) -> bool:
        """Whether ``_try_admit`` could take anyone now. Budget and room only shrink while a
        step is planned, so when this is False the whole admission pass is skipped: it would
        stop at its first candidate (and ordering the queue costs O(waiting) per step)."""
        return budget > 0 and len(self.running) < self.max_num_seqs and bool(self.waiting)

    def _try_admit(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int | None:
        """Admit a waiting sequence with its first chunk; None when it does not fit now."""
        if budget <= 0 or len(self.running) >= self.max_num_seqs:
            self._refuse(batch, seq, self._refused(budget))
            return None
        hits = self._prefix_hits(seq)
        cached = len(hits) * self.blocks.block_size
        remaining = seq.num_tokens - cached
        num_new = min(remaining, budget)
        if num_new < remaining and not self.params.enable_chunked_prefill:
            if batch.entries or remaining <= self.token_budget:
                figures = TokenBudget(budget, self._prompt_budget, remaining)
                self._refuse(batch, seq, Hold(WaitReason.PROMPT_BUDGET_SPENT, figures))
                return None
            num_new = remaining  # a prompt over the whole budget runs alone, unchunked
        if not self.blocks.can_admit(hits, cached + num_new):
            self._refuse(batch, seq, self._short(hits, seq, cached + num_new))
            return None
        self.waiting.remove(seq)
        self._admit(seq, cached + num_new, hits)
        self.running.append(seq)
        self._schedule(batch, seq, num_new)
        return num_new
