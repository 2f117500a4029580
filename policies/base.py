"""The policy seam: what every scheduling policy implements, and the mechanics they share.

A policy owns the queue and decides, once per engine step, which sequences compute how many
tokens. It never runs the model: it hands the runner a ScheduledBatch. The blocks a step
needs (admissions, growth, prefix registrations) are proposed into the step's StepChanges,
``schedule(changes)``; the engine commits or rolls them back once the step ran. Frees
(finish, abort, preemption) and trims happen at once. Policies can be swapped at a step
boundary: ``handover()`` gives up every sequence with its KV blocks and
progress, the next policy's ``adopt()`` takes them over.

Aging (``max_wait_s``): a waiting request that has waited longer than that since its arrival
(not since the last switch, so switching cannot reset it) is admitted before any newer one,
and while it cannot be admitted no newer one is; nothing is preempted for it. Policies read
time only from the engine's clock, handed in when they are built, so a virtual clock works.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import abc
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from engine.batch import ScheduledBatch, ScheduledSeq
from engine.config import EngineLimits
from engine.kv_cache import BlockManager
from engine.kv_step import StepChanges
from engine.sequence import NO_BLOCKS, Sequence, SequenceStatus
from engine.tenants import TenantLedger
from engine.timeline import BlocksShort, Hold, PreemptCause, QueueHead, WaitReason
from policies.discipline import Fcfs, QueueDiscipline, SortKey
from policies.json_types import JsonNumberOrNull
from policies.snapshot import PolicySnapshot
from policies.waiting import WaitingQueue

PolicyName = Literal["static", "dynamic", "continuous", "hybrid"]


DEFAULT_MAX_WAIT_S = 30.0
"""Aging bound of the latency-oriented policies (continuous, hybrid); the batchers that model
the article (static, dynamic) default to no aging so the benchmark measures them as they are."""


def max_wait_field(default: float | None) -> Any:
    return Field(
        default,
        gt=0,
        le=86400,
        description=(
            "Aging: a request waiting longer than this many seconds since its arrival is "
            "admitted before any newer one (newer ones wait; nothing is preempted). "
            "null turns aging off."
        ),
        json_schema_extra={"x-null": "off"},
    )


def cap_error(field: str, value: Any, limit_name: str, limits: EngineLimits) -> str | None:
    """Why ``value`` exceeds the engine cap ``limit_name`` (None: it does not)."""
    cap = getattr(limits, limit_name)
    if value is None or value <= cap:
        return None
    return f"must be <= the engine cap {limit_name}={cap}, got {value}"


class PolicyParams(BaseModel):
    """Base of every policy's params. ``caps`` maps a field to the EngineLimits attribute it
    may not exceed; at the edge the limits come in through the validation context
    (``{"limits": ...}``), a value read back from the store is checked with ``over_caps``.

    The params given are the params: a dump holds only the fields that were set (a stored
    version keeps following the defaults for the rest), ``effective`` fills in the rest."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    caps: ClassVar[dict[str, str]] = {}
    max_wait_s: JsonNumberOrNull = max_wait_field(None)

    @field_validator("*")
    @classmethod
    def _within_engine_caps(cls, value: Any, info: ValidationInfo) -> Any:
        limit_name = cls.caps.get(info.field_name or "")
        limits = (info.context or {}).get("limits")
        if limit_name is None or limits is None:
            return value
        if (why := cap_error(info.field_name or "", value, limit_name, limits)) is not None:
            raise ValueError(why)
        return value

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]  # unannotated: the schema stays the model's
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def over_caps(self, limits: EngineLimits) -> dict[str, str]:
        """Each field given above its engine cap, with why (empty: all fit). A default is
        never checked, as a parse never checks one: the policy keeps it within the cap."""
        errors = {}
        for field, limit_name in self.caps.items():
            if field not in self.model_fields_set:
                continue
            if (why := cap_error(field, getattr(self, field), limit_name, limits)) is not None:
                errors[field] = why
        return errors

    def effective(self, limits: EngineLimits) -> dict[str, Any]:
        """Every param in force: a capped field left ``None`` shows the engine cap it stands
        for; any other ``None`` (``max_wait_s``) means the feature is off."""
        params = {field: getattr(self, field) for field in type(self).model_fields}
        for field, limit_name in self.caps.items():
            if params.get(field) is None:
                params[field] = getattr(limits, limit_name)
        return params


MaxNumSeqs = Field(
    None,
    ge=1,
    le=65536,
    description="Most sequences in one batch (default: the engine cap).",
    json_schema_extra={"x-null": "engine cap"},
)
MaxBatchedTokens = Field(
    None,
    ge=1,
    le=1 << 20,
    description="Token budget of one step (default: the engine cap).",
    json_schema_extra={"x-null": "engine cap"},
)


class SchedulingPolicy(ABC):
    name: ClassVar[str]
    params_model: ClassVar[type[PolicyParams]]
    admits_in_queue_order: ClassVar[bool] = True
    """Under fcfs the policy admits in its waiting queue's order (aging aside)."""

    def __init__(
        self,
        params: PolicyParams,
        limits: EngineLimits,
        blocks: BlockManager,
        clock: Callable[[], float],
        discipline: QueueDiscipline | None = None,
    ) -> None:
        self.params = params
        self.limits = limits
        self.blocks = blocks
        self.clock = clock
        self.discipline = discipline or Fcfs(TenantLedger())
        """Whose sequence goes first (the setting's ``queue``; first come, first served)."""
        self.waiting = WaitingQueue()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._changes: StepChanges | None = None
        self._admitted: list[Sequence] = []
        self._head: tuple[int, int, Sequence | None] | None = None
        """The queue's head in admission order, with the queue's version it was found at."""

    # -- the interface ------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq_id: str) -> Sequence | None:
        """Drop a sequence wherever it is and free its blocks."""
        for seq in list(self.waiting):
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                self.blocks.free(seq_id)
                return seq
        for seq in self.running:
            if seq.seq_id == seq_id:
                self.running.remove(seq)
                self.blocks.free(seq_id)
                return seq
        return None

    def schedule(self, changes: StepChanges) -> ScheduledBatch:
        """Plan one step; every block change it needs is proposed into ``changes`` (the
        engine commits or rolls them back once the step has run)."""
        self._changes = changes
        admitted: list[Sequence] = []
        self._admitted = admitted
        try:
            batch = self._plan()
        finally:
            self._changes = None
        batch.block_copies = changes.take_copies()
        batch.admitted = admitted
        return batch

    @abstractmethod
    def _plan(self) -> ScheduledBatch:
        """Build the step's batch, proposing block changes into ``self.changes``."""

    @property
    def changes(self) -> StepChanges:
        """The open step's block changes (only while ``schedule`` runs)."""
        if self._changes is None:
            raise RuntimeError("blocks are allocated or grown only while a step is scheduled")
        return self._changes

    def on_step_done(self, batch: ScheduledBatch, finished: list[Sequence]) -> None:
        """Finished sequences leave at once and give their blocks back."""
        if not finished:
            return
        done = {id(seq) for seq in finished}  # one pass over ``running``, not one per finish
        self.running = [s for s in self.running if id(s) not in done]
        for seq in finished:
            self.blocks.free(seq.seq_id)

    def handover(self) -> list[Sequence]:
        """Give up every unfinished sequence: running ones first, then the queue in order."""
        seqs = [s for s in self.running if not s.is_finished] + list(self.waiting)
        self.running.clear()
        self.waiting.clear()
        return seqs

    def adopt(self, seqs: list[Sequence]) -> None:
        """Take sequences over with their blocks and progress; the rest join the queue."""
        for seq in seqs:
            if self.blocks.holds(seq.seq_id):
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
            else:
                seq.status = SequenceStatus.WAITING
                self.waiting.append(seq)

    def live_ids(self) -> set[str]:
        """Sequences whose blocks this policy holds or will need (reclaim leaves these)."""
        return {s.seq_id for s in self.running} | {s.seq_id for s in self.waiting}

    def snapshot(self) -> PolicySnapshot:
        return PolicySnapshot(
            policy=self.name,
            params=self.params.effective(self.limits),
            waiting=len(self.waiting),
            running=len(self.running),
            preemptions=self.num_preemptions,
            overdue=len(self._overdue(self.waiting)),
            mode=self.mode,
            draining_to=self.draining_to,
        )

    @property
    def running_cap(self) -> int | None:
        """The most sequences this policy lets run at once (None: no cap of its own)."""
        return None

    @property
    def draining_to(self) -> int | None:
        """``running_cap`` while more sequences than it are running, else None. A live change
        that lowers a cap keeps every running sequence (with its blocks) and admits nobody
        until the running count is under the new cap: it drains, it never preempts."""
        cap = self.running_cap
        return cap if cap is not None and len(self.running) > cap else None

    @property
    def mode(self) -> str | None:
        """A policy that switches between ways of batching names the current one."""
        return None

    @property
    def queue_depth(self) -> int:
        return len(self.waiting) + len(self.running)

    def ahead(self, seqs: list[Sequence]) -> list[int]:
        """How many waiting sequences are ahead of each of ``seqs`` (waiting ones) in the
        admission order. Called when sequences start waiting behind others (not per step):
        the queue's own order under fcfs, one pass over the discipline's order otherwise."""
        if self.admits_in_queue_order and isinstance(self.discipline, Fcfs):
            return [_index(self.waiting, s) for s in seqs]
        order = {id(s): i for i, s in enumerate(self._first_order())}
        return [order.get(id(s), 0) for s in seqs]

    # -- shared mechanics ---------------------------------------------------------------

    def _queue_head(self) -> Sequence | None:
        """The waiting sequence first in admission order, found again only when the queue
        changed (aging's promotions and the fair counters show at the queue's next change)."""
        waiting = self.waiting
        cached = self._head
        if cached is None or cached[:2] != (id(waiting), waiting.version):
            cached = self._head = (id(waiting), waiting.version, next(self._first_order(), None))
        return cached[2]

    def _first_order(self) -> Iterator[Sequence]:
        """The waiting sequences in the order the policy admits them (its head first)."""
        return self._admission_order(self.waiting)

    def _report(self, batch: ScheduledBatch, hold: Hold) -> None:
        """No admission pass named the head: the queue's head waits for ``hold``."""
        if batch.waiting_on is None and (head := self._queue_head()) is not None:
            batch.waiting_on = QueueHead(head, hold)

    @staticmethod
    def _refuse(batch: ScheduledBatch, seq: Sequence, hold: Hold) -> None:
        """The admission pass refused ``seq`` for ``hold`` (the first refusal names the head)."""
        if batch.waiting_on is None:
            batch.waiting_on = QueueHead(seq, hold)

    def _short(self, hits: list[int], seq: Sequence, num_tokens: int | None = None) -> Hold:
        """KV blocks short for admitting ``num_tokens`` of ``seq`` (default: all of them)."""
        blocks = self.blocks
        needed = blocks.blocks_to_admit(hits, seq.num_tokens if num_tokens is None else num_tokens)
        figures = BlocksShort(needed, blocks.admissible, blocks.reserved)
        return Hold(WaitReason.KV_BLOCKS_SHORT, figures)

    def _overdue(self, seqs: Iterable[Sequence]) -> list[Sequence]:
        """Sequences among ``seqs`` that waited past ``max_wait_s`` since arrival, oldest
        first (empty when aging is off)."""
        limit = self.params.max_wait_s
        if limit is None:
            return []
        deadline = self.clock() - limit
        return sorted((s for s in seqs if s.arrival_time < deadline), key=lambda s: s.arrival_time)

    def _admission_order(
        self, waiting: abc.Sequence[Sequence], key: SortKey | None = None
    ) -> Iterator[Sequence]:
        """``waiting`` in the discipline's order (``key``: the policy's own among equals), with
        overdue sequences moved to the front, oldest first."""
        overdue = self._overdue(waiting)
        if not overdue:
            return self.discipline.order(waiting, key)
        first = set(overdue)
        rest = self.discipline.order([s for s in waiting if s not in first], key)
        return itertools.chain(overdue, rest)

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks holding ``seq``'s leading tokens; none for a request that asks for
        its prompt's logprobs (they exist only for positions a step computes)."""
        if seq.params.prompt_logprobs is not None:
            return []
        return self.blocks.match_prefix(seq.token_ids)

    def _admit(self, seq: Sequence, hold_tokens: int, hits: list[int]) -> None:
        """Give a waiting sequence its blocks (prefix hits first) and mark it running."""
        cached = self.changes.allocate(seq.seq_id, seq.token_ids, hold_tokens, hits)
        seq.block_table = self.blocks.table(seq.seq_id)
        seq.num_computed_tokens = cached
        seq.num_cached_tokens = max(seq.num_cached_tokens, cached)
        seq.status = SequenceStatus.RUNNING
        self._admitted.append(seq)

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.free(seq.seq_id)

    def _preempt(
        self, seq: Sequence, batch: ScheduledBatch, cause: PreemptCause = PreemptCause.MEMORY
    ) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, requeue at the front."""
        self.blocks.free(seq.seq_id)
        seq.block_table = NO_BLOCKS
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)
        batch.preempt_causes.append(cause)
        batch.entries = [e for e in batch.entries if e.seq is not seq]

    def _reserve_slots(
        self, seq: Sequence, num_tokens: int, batch: ScheduledBatch, may_preempt: bool = True
    ) -> bool:
        """Make room for ``num_tokens`` more of ``seq``'s tokens, preempting running sequences
        (the discipline's victim, docs/fairness.md's order) while the pool is empty. False when
        ``seq`` itself had to go (or, without ``may_preempt``, when there is no room).

        Preemption must not follow an admission in the same step: a newly admitted request
        may already share blocks that an older one publishes in this step.
        """
        start = seq.num_computed_tokens
        changes = self._changes or self.changes  # the property raises outside a step
        while not changes.grow(seq.seq_id, start, start + num_tokens):
            if not may_preempt:
                return False
            victim = self.discipline.victim(self.running)
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _schedule(self, batch: ScheduledBatch, seq: Sequence, num_new: int, pads: int = 0) -> None:
        batch.entries.append(ScheduledSeq(seq, num_new, pads))
        if num_new:
            changes = self._changes or self.changes  # the property raises outside a step
            changes.register(seq.seq_id, seq.token_ids, seq.num_computed_tokens + num_new)


def _index(waiting: WaitingQueue, seq: Sequence) -> int:
    """``seq``'s place in ``waiting`` (0 if it is not there)."""
    try:
        return waiting.index(seq)
    except ValueError:
        return 0
