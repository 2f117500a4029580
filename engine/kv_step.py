"""One engine step's changes to the KV block pool (``StepChanges``), and their outcome.

The step transaction is a unit of its own: the policy proposes changes into it while it
schedules, the engine settles it (commit the rows that ran, roll back the rest). It is the
``BlockManager``'s one friend (engine/kv_cache.py): it works the manager's private tables and
pool (engine/kv_blocks.py) through the manager's private helpers, which nothing else may touch
(tests/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.kv_cache import BlockManager

Before = tuple[int | None, int]
"""A sequence as the step found it: its table's length (None: admitted in this step) and its
chain's. Within a step a table only grows at its end and swaps entries (copy-on-write, kept
apart as ``(index, source, copy)``), so that is all a rollback needs."""


class StepChanges:
    """One engine step's block changes, and their outcome.

    The policy proposes them while it schedules (``allocate``, ``grow``, ``register``; the
    copy-on-write pairs leave through ``take_copies`` for the runner). The engine then settles
    the step: ``rollback(ids)`` undoes the changes of sequences whose row failed, ``commit``
    stores the K/V of the rows that ran, confirms their prefix blocks and closes the step;
    ``rollback()`` with no ids undoes the whole step and closes it.

    Until the step settles, a copy-on-write source stays referenced and freshly published
    prefix blocks are provisional, so a rollback gives every sequence back the exact table
    it began the step with (a newly admitted one gives its table up). A sequence admitted on
    a provisional block of a sequence that is rolled back depends on K/V nobody vouches for:
    it is rolled back with it. What a rollback cannot restore is a cached prefix block
    evicted to make room: the prefix cache is only a cache.
    """

    def __init__(self, manager: BlockManager) -> None:
        self._m = manager
        self._before: dict[str, Before] = {}
        self._swaps: dict[str, list[tuple[int, int, int]]] = {}
        self._published: dict[str, list[tuple[int, int]]] = {}
        self._publisher: dict[int, str] = {}
        self._dependents: dict[str, list[str]] = {}
        self._rolled_back: set[str] = set()
        self._copies: list[tuple[int, int]] = []

    @property
    def is_open(self) -> bool:
        return self._m._step is self

    # -- proposals (the policy) -----------------------------------------------------------

    def allocate(
        self,
        seq_id: str,
        token_ids: Sequence[int],
        num_tokens: int,
        hits: list[int] | None = None,
    ) -> int:
        """Give a new sequence a table covering ``num_tokens`` slots; returns cached tokens.
        The caller checks ``can_admit`` first (admission respects the reserve)."""
        self._check_open()
        hits = self._m.match_prefix(token_ids) if hits is None else hits
        cached = self._m._allocate(seq_id, token_ids, num_tokens, hits)
        self._before[seq_id] = (None, 0)
        for publisher in {self._publisher[b] for b in hits if b in self._publisher}:
            self._dependents.setdefault(publisher, []).append(seq_id)
        return cached

    def grow(self, seq_id: str, start: int, end: int) -> bool:
        """Make slots ``[start, end)`` writable: add blocks, copy shared ones (copy-on-write).
        May take reserve blocks. Returns False, changing nothing, when the pool is too empty."""
        if self._m._writable(seq_id, start, end):
            if self._m._step is not self:
                self._check_open()  # raises
            return True  # nothing to change (most decodes): the step need not record it
        self._touch(seq_id)
        swaps: list[tuple[int, int, int]] = []
        grown = self._m._grow(seq_id, start, end, swaps)
        if swaps:
            self._swaps.setdefault(seq_id, []).extend(swaps)
            self._copies.extend((old, new) for _, old, new in swaps)
        return grown

    def register(self, seq_id: str, token_ids: Sequence[int], num_tokens: int) -> None:
        """Publish the full blocks among the first ``num_tokens`` for prefix sharing, when
        the step that computes them is scheduled: requests admitted later in the same step
        already share them (every layer writes the step's K/V before it attends)."""
        m = self._m
        if not m.enable_prefix_caching or num_tokens // m.block_size <= len(m._chains[seq_id]):
            if m._step is not self:
                self._check_open()  # raises
            return  # no new full block (most decodes)
        self._touch(seq_id)
        published = self._m._register(seq_id, token_ids, num_tokens)
        if published:
            self._published.setdefault(seq_id, []).extend(published)
            self._publisher.update((block, seq_id) for block, _ in published)

    def take_copies(self) -> list[tuple[int, int]]:
        """``(source, copy)`` block pairs the runner must copy before the forward."""
        copies, self._copies = self._copies, []
        return copies

    # -- outcome (the engine) -------------------------------------------------------------

    def commit(self, written: Mapping[str, tuple[int, int]]) -> None:
        """The rows that ran stored K/V for tokens ``[start, end)`` of each sequence in
        ``written``; keep every change not rolled back and close the step. Prefix blocks
        published by a sequence that stored nothing are withdrawn."""
        self._check_open()
        m = self._m
        if not self._rolled_back.isdisjoint(written):
            raise ValueError(
                f"rolled back, not written: {sorted(self._rolled_back & set(written))}"
            )
        store, tables = m._pool.store, m._tables
        for seq_id, (start, end) in written.items():
            store(tables[seq_id], start, end)
        for source in self._sources():
            m._pool.release(source)
        for seq_id, published in self._published.items():
            if seq_id not in written:
                m._unpublish(published)
        m._step = None

    def rollback(self, seq_ids: Iterable[str] | None = None) -> list[str]:
        """Undo the changes of ``seq_ids`` and of the sequences admitted on their provisional
        prefix blocks (all changes, closing the step, when None). Returns the sequences whose
        admission was undone: they hold no blocks any more, and store nothing at commit."""
        self._check_open()
        everything = seq_ids is None
        ids = list({**self._before, **self._published}) if seq_ids is None else list(seq_ids)
        for seq_id in ids:  # grows while it runs: dependents of dependents
            ids.extend(d for d in self._dependents.pop(seq_id, ()) if d not in ids)
        self._rolled_back.update(ids)
        undone = []
        for seq_id in ids:
            self._m._unpublish(self._published.pop(seq_id, []))
            before = self._before.pop(seq_id, None)
            swaps = self._swaps.pop(seq_id, [])
            if before is None or not self._m.holds(seq_id):
                continue
            if before[0] is None:
                self._m.free(seq_id)
                undone.append(seq_id)
            else:
                self._m._restore(seq_id, before, swaps)
        if everything:
            self._copies.clear()
            self._m._step = None
        return undone

    # -- internals ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if not self.is_open:
            raise RuntimeError("this step's block changes are already settled")

    def _touch(self, seq_id: str) -> None:
        if self._m._step is not self:
            raise RuntimeError("this step's block changes are already settled")
        if seq_id not in self._before:
            self._before[seq_id] = (len(self._m._tables[seq_id]), len(self._m._chains[seq_id]))

    def _sources(self) -> Iterator[int]:
        return (old for swaps in self._swaps.values() for _, old, _ in swaps)

    def _forget(self, seq_id: str) -> None:
        """The sequence is being freed mid-step (preempted): its copy-on-write sources are
        released now, and nothing of it is left to undo but its publications."""
        self._before.pop(seq_id, None)
        for _, old, _ in self._swaps.pop(seq_id, ()):
            self._m._pool.release(old)
