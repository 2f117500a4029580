"""Queue disciplines: the order in which a policy admits its waiting sequences, and whom it
preempts when the pool runs dry. A policy owns one (``SchedulingPolicy.discipline``), built
from the setting's ``queue`` (``policies/queue.py``) over the engine's ``TenantLedger``.

The discipline decides *whose* sequence goes first; the policy's own order (its ``key``:
arrival, a length bucket) decides among equals. Aging is the policy's and comes first.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from engine.sequence import Sequence
from engine.tenants import TenantLedger
from policies.queue import FairQueue, FcfsQueue, PriorityQueue, QueueSpec
from policies.waiting import WaitingQueue

SortKey = Callable[[Sequence], Any]


class QueueDiscipline(ABC):
    name: ClassVar[str]
    preempts: bool = False
    """Whether a waiting sequence may take a running one's place (``priority`` with preempt)."""

    def __init__(self, ledger: TenantLedger) -> None:
        self.ledger = ledger

    @abstractmethod
    def order(self, seqs: Iterable[Sequence], key: SortKey | None = None) -> Iterator[Sequence]:
        """``seqs`` (a policy's waiting ones, in its queue's order) in admission order; among
        equals by ``key`` (None: as given). Lazy: a pass that stops early pays for what it took."""

    def victim(self, running: list[Sequence]) -> Sequence:
        """Whom to preempt, under every discipline (docs/fairness.md): the lowest priority
        (the highest value), then the tenant most over its share (the largest counter in the
        ledger, which every discipline keeps), then the latest arrival; among sequences equal
        in all three (one batch's requests, a family's forks), the last in ``running``."""
        counter = self.ledger.counter
        # max() keeps the first of equals: walk from the end so the last one wins a tie.
        return max(reversed(running), key=lambda s: (s.priority, counter(s.tenant), s.arrival_time))

    def rank(self, seq: Sequence) -> int:
        """The class a padded-group policy groups within (dynamic: classes first, then
        lengths); 0 for all where the discipline has no classes."""
        return 0

    def displaces(self, waiting: Sequence, running: Sequence) -> bool:
        """Whether ``waiting`` may preempt ``running`` to take its place (``preempts`` only)."""
        return False


class Fcfs(QueueDiscipline):
    name = "fcfs"

    def order(self, seqs: Iterable[Sequence], key: SortKey | None = None) -> Iterator[Sequence]:
        return iter(list(seqs) if key is None else sorted(seqs, key=key))


class Priority(QueueDiscipline):
    """Lower ``priority`` first (the victim is the base class's: the highest value first)."""

    name = "priority"

    def __init__(self, ledger: TenantLedger, preempt: bool) -> None:
        super().__init__(ledger)
        self.preempts = preempt

    def order(self, seqs: Iterable[Sequence], key: SortKey | None = None) -> Iterator[Sequence]:
        if key is None:
            return iter(sorted(seqs, key=_priority))  # stable: the queue's order among equals
        return iter(sorted(seqs, key=lambda s: (s.priority, key(s))))

    def rank(self, seq: Sequence) -> int:
        return seq.priority

    def displaces(self, waiting: Sequence, running: Sequence) -> bool:
        return waiting.priority < running.priority


class Fair(QueueDiscipline):
    """The Virtual Token Counter: the tenant with the least counter goes first; each pick
    raises that tenant's counter, within the pass, by what its prompt will cost when admitted
    (as the admission will), so one pass interleaves tenants as VTC's loop does. A tenant's
    own sequences go by priority, then the policy's order. The victim is the base class's
    (the highest priority value first, then the tenant with the largest counter)."""

    name = "fair"

    def __init__(self, ledger: TenantLedger) -> None:
        super().__init__(ledger)
        self._grouped: tuple[int, int, SortKey | None, dict[str, list[Sequence]]] | None = None
        """The last queue's per-tenant order, kept while that ``WaitingQueue`` is unchanged."""

    def order(self, seqs: Iterable[Sequence], key: SortKey | None = None) -> Iterator[Sequence]:
        by_tenant = self._by_tenant(seqs, key)
        if len(by_tenant) <= 1:
            for own in by_tenant.values():
                yield from list(own)
            return
        ledger = self.ledger
        heap = [(ledger.counter(t), i, t) for i, t in enumerate(by_tenant)]
        heapq.heapify(heap)
        queues = {t: iter(list(own)) for t, own in by_tenant.items()}
        while heap:
            counter, i, tenant = heapq.heappop(heap)
            picked = next(queues[tenant], None)
            if picked is None:
                continue
            yield picked
            cost = picked.account.input_cost if picked.account is not None else 1.0
            heapq.heappush(heap, (counter + cost * picked.num_prompt_tokens, i, tenant))

    def _by_tenant(
        self, seqs: Iterable[Sequence], key: SortKey | None
    ) -> dict[str, list[Sequence]]:
        """Each tenant's sequences in its own order; reused while ``seqs`` is the same
        unchanged ``WaitingQueue`` (most steps admit nobody and change no queue)."""
        cached = self._grouped
        if (
            cached
            and isinstance(seqs, WaitingQueue)
            and cached[:3] == (id(seqs), seqs.version, key)
        ):
            return cached[3]
        by_tenant: dict[str, list[Sequence]] = {}
        for seq in seqs:
            by_tenant.setdefault(seq.tenant, []).append(seq)
        for tenant, own in by_tenant.items():
            by_tenant[tenant] = _own_order(own, key)
        if isinstance(seqs, WaitingQueue):
            self._grouped = (id(seqs), seqs.version, key, by_tenant)
        return by_tenant


def _priority(seq: Sequence) -> int:
    return seq.priority


def _own_order(seqs: list[Sequence], key: SortKey | None) -> list[Sequence]:
    if key is None:
        return sorted(seqs, key=_priority)
    return sorted(seqs, key=lambda s: (s.priority, key(s)))


def make_discipline(spec: QueueSpec, ledger: TenantLedger) -> QueueDiscipline:
    if isinstance(spec, PriorityQueue):
        return Priority(ledger, spec.preempt)
    if isinstance(spec, FairQueue):
        return Fair(ledger)
    assert isinstance(spec, FcfsQueue)
    return Fcfs(ledger)
