"""Paged KV cache bookkeeping: the manager (BlockManager) of the sequences' block tables and
prefix chains, over its pool of blocks (engine/kv_blocks.py's ``BlockPool``: ref counts, fill,
the free and cached lists, the prefix index); a table is read through ``BlockTable``
(engine/block_table.py). One step's changes to it are engine/kv_step.py's ``StepChanges``,
the manager's one friend; the tensors it indexes are engine/kv_pool.py's. No torch here.

Every block is ``free``, ``used`` or ``cached`` (engine/kv_blocks.py). ``reserved`` is not a
state: it is how many free-or-cached blocks admission of new work must leave alone. Running
sequences may grow into the reserve.

The manager's tables, chains and pool are its own: callers read them through ``holds``,
``table`` (a read-only live view), ``stored_tokens``, ``ref_count`` and ``stats``. Inside an
engine step, blocks change only through the step's ``StepChanges`` (opened with
``begin_step``): the policy proposes allocations, growth and prefix registrations into it,
the engine commits the rows that ran and rolls back the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from engine.block_table import BlockTable
from engine.kv_blocks import ROOT_HASH, BlockPool, prefix_chain
from engine.kv_budget import reserved_blocks
from engine.kv_stats import BlockState, KVIntegrity, KVStats, ReclaimResult
from engine.kv_step import Before, StepChanges

__all__ = ["ROOT_HASH", "BlockManager", "BlockTable", "prefix_chain"]


class BlockManager:
    """Block tables, ref counts, prefix sharing (chained full-block hashes) and the reserve."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        memory_reserve: float,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.memory_reserve = memory_reserve
        self.enable_prefix_caching = enable_prefix_caching
        self._pool = BlockPool(num_blocks, block_size)
        self._tables: dict[str, list[int]] = {}
        self._chains: dict[str, list[int]] = {}
        """Each sequence's prefix hash chain: one hash per full block it has published."""
        self._step: StepChanges | None = None

    # -- counts -------------------------------------------------------------------------

    @property
    def reserved(self) -> int:
        return reserved_blocks(self.num_blocks, self.memory_reserve)

    @property
    def num_free(self) -> int:
        return self._pool.num_free

    @property
    def num_cached(self) -> int:
        return self._pool.num_cached

    @property
    def num_used(self) -> int:
        return self._pool.num_used

    @property
    def live_tokens(self) -> int:
        return self._pool.live_tokens

    @property
    def admissible(self) -> int:
        """Blocks new work may still take without entering the reserve."""
        return max(0, self._pool.num_free + self._pool.num_cached - self.reserved)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def stats(self) -> KVStats:
        pool = self._pool
        used = pool.num_used
        return KVStats(
            block_size=self.block_size,
            total=self.num_blocks,
            free=pool.num_free,
            used=used,
            cached=pool.num_cached,
            reserved=self.reserved,
            live_tokens=pool.live_tokens,
            held_slots=used * self.block_size,
        )

    def state_of(self, block: int) -> BlockState:
        return self._pool.state_of(block)

    def ref_count(self, block: int) -> int:
        return self._pool.ref_count[block]

    def block_map(self) -> str:
        """One character per block: ``.`` free, ``#`` used, ``c`` cached."""
        return self._pool.block_map()

    # -- per sequence -------------------------------------------------------------------

    def holds(self, seq_id: str) -> bool:
        """Whether the sequence holds a block table (it may be empty)."""
        return seq_id in self._tables

    def table(self, seq_id: str) -> BlockTable:
        """The sequence's blocks in logical order, as a read-only live view."""
        return BlockTable(self._tables[seq_id])

    def stored_tokens(self, seq_id: str) -> int:
        """Tokens whose K/V is stored in the sequence's blocks (0 when it holds none)."""
        fill = self._pool.fill
        return sum(fill[b] for b in self._tables.get(seq_id, ()))

    def holders(self) -> list[str]:
        """Ids of the sequences holding a block table."""
        return list(self._tables)

    # -- prefix cache -----------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Cached blocks holding this prompt's leading full blocks.

        The block holding the last token is never matched: its logits must be computed, and
        a shared block is never written.
        """
        if not self.enable_prefix_caching:
            return []
        return self._pool.match(token_ids, (len(token_ids) - 1) // self.block_size)

    def blocks_to_admit(self, hits: list[int], num_tokens: int) -> int:
        """Free-or-cached blocks that admitting ``num_tokens`` with these hits would take."""
        fresh = max(0, self.blocks_for(num_tokens) - len(hits))
        ref_count = self._pool.ref_count
        return fresh + sum(1 for b in hits if ref_count[b] == 0)

    def can_admit(self, hits: list[int], num_tokens: int) -> bool:
        return self.blocks_to_admit(hits, num_tokens) <= self.admissible

    # -- a step's changes ---------------------------------------------------------------

    def begin_step(self) -> StepChanges:
        """Open the step whose block changes the policy proposes and the engine settles."""
        if self._step is not None:
            raise RuntimeError("the previous step's block changes were never settled")
        self._step = StepChanges(self)
        return self._step

    # -- outside a step's proposals -------------------------------------------------------

    def free(self, seq_id: str) -> int:
        """Release a sequence's blocks (idempotent); returns how many reached ref count 0.
        Allowed inside a step (a preemption): the step then forgets the sequence's changes."""
        if self._step is not None:
            self._step._forget(seq_id)
        table = self._tables.pop(seq_id, None)
        self._chains.pop(seq_id, None)
        if table is None:
            return 0
        release = self._pool.release
        return sum(release(b) for b in reversed(table))

    def trim(self, seq_id: str, num_tokens: int) -> int:
        """Give back blocks beyond what ``num_tokens`` need (a padded reservation, say)."""
        self._between_steps("trim")
        table = self._tables[seq_id]
        keep = self.blocks_for(num_tokens)
        released = 0
        while len(table) > keep:
            released += self._pool.release(table.pop())
        return released

    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares every block of the parent; writes copy first."""
        self._between_steps("fork")
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already holds blocks")
        table = self._tables[parent_id]
        for block in table:
            self._pool.share(block)
        self._tables[child_id] = list(table)
        self._chains[child_id] = list(self._chains[parent_id])

    # -- maintenance --------------------------------------------------------------------

    def reclaim(self, live_ids: Iterable[str]) -> ReclaimResult:
        """Free tables of sequences that are not live and blocks nobody references.

        Never touches a live sequence's blocks; the prefix cache is left alone unless free
        blocks fall under the reserve (then the oldest cached blocks are evicted).
        """
        self._between_steps("reclaim")
        started = time.perf_counter()
        pool = self._pool
        free_before = pool.num_free
        live = set(live_ids)
        freed = sum(self.free(seq_id) for seq_id in [s for s in self._tables if s not in live])
        freed += pool.sweep_unlisted()
        evicted = self.evict_to_reserve()
        return ReclaimResult(
            freed=freed,
            evicted=evicted,
            free_before=free_before,
            free_after=pool.num_free,
            reserve_breached=pool.num_free + pool.num_cached < self.reserved,
            duration_s=time.perf_counter() - started,
        )

    def evict_to_reserve(self) -> int:
        """The memory-reserve guard: evict cached blocks, oldest first, until free ≥ reserve."""
        return self._pool.evict_until(self.reserved)

    def integrity_problems(self) -> list[str]:
        """Where the bookkeeping contradicts itself; empty when it is sound. Cheap enough to
        run at a step boundary on a live server (``GET /admin/kv/integrity``)."""
        refs = [0] * self.num_blocks
        for table in self._tables.values():
            for block in table:
                refs[block] += 1
        for block in self._step._sources() if self._step else ():
            refs[block] += 1  # a copy-on-write source stays referenced until the step settles
        return self._pool.problems(refs)

    def integrity(self) -> KVIntegrity:
        """``integrity_problems`` and the counts, as the typed self-check record."""
        problems = tuple(self.integrity_problems())
        return KVIntegrity(ok=not problems, problems=problems, stats=self.stats())

    def check_integrity(self) -> None:
        """Raise AssertionError naming every contradiction in the bookkeeping (tests use it)."""
        if problems := self.integrity_problems():
            raise AssertionError("; ".join(problems))
        assert not self._pool.stale_hashes(), "hash index points at a stale block"

    # -- internals ----------------------------------------------------------------------

    def _between_steps(self, what: str) -> None:
        if self._step is not None:
            raise RuntimeError(f"{what} runs between steps, not while one is open")

    def _allocate(
        self, seq_id: str, token_ids: Sequence[int], num_tokens: int, hits: list[int] | None
    ) -> int:
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        if hits is None:
            hits = self.match_prefix(token_ids)
        needed = self.blocks_to_admit(hits, num_tokens)
        if needed > self.num_free + self.num_cached:
            raise ValueError(
                f"sequence {seq_id!r} needs {needed} blocks, "
                f"{self.num_free + self.num_cached} are not in use"
            )
        pool = self._pool
        table: list[int] = []
        for block in hits:
            pool.share(block)
            table.append(block)
        self._tables[seq_id] = table
        self._chains[seq_id] = [pool.published_hash(b) for b in hits]
        self._extend(table, self.blocks_for(num_tokens))
        return len(hits) * self.block_size

    def _writable(self, seq_id: str, start: int, end: int) -> bool:
        """Whether slots ``[start, end)`` are already held and unshared (growing changes
        nothing). O(blocks written), so a decode checks one block."""
        table = self._tables[seq_id]
        size = self.block_size
        if end > len(table) * size:
            return False
        ref_count = self._pool.ref_count
        first, last = start // size, (end - 1) // size
        if first == last:
            return ref_count[table[first]] <= 1
        return all(ref_count[table[j]] <= 1 for j in range(first, last + 1))

    def _grow(self, seq_id: str, start: int, end: int, swaps: list[tuple[int, int, int]]) -> bool:
        table = self._tables[seq_id]
        pool = self._pool
        size = self.block_size
        needed = self.blocks_for(end)
        shared = [
            j for j in range(start // size, min(len(table), needed)) if pool.ref_count[table[j]] > 1
        ]
        if max(0, needed - len(table)) + len(shared) > pool.num_free + pool.num_cached:
            return False
        for j in shared:
            old = table[j]
            new = pool.take_copy(old)
            swaps.append((j, old, new))  # ``old`` keeps this reference until the step settles
            table[j] = new
        self._extend(table, needed)
        return True

    def _register(
        self, seq_id: str, token_ids: Sequence[int], num_tokens: int
    ) -> list[tuple[int, int]]:
        """Publish full blocks; returns the (block, hash) pairs newly published."""
        if not self.enable_prefix_caching:
            return []
        table = self._tables[seq_id]
        chain = self._chains[seq_id]
        parent = chain[-1] if chain else ROOT_HASH
        size = self.block_size
        publish = self._pool.publish
        published = []
        fresh = prefix_chain(token_ids, size, num_tokens // size, parent, start=len(chain))
        for j, (parent, tokens) in enumerate(fresh, start=len(chain)):
            chain.append(parent)
            if publish(table[j], parent, tokens):
                published.append((table[j], parent))
        return published

    def _unpublish(self, published: list[tuple[int, int]]) -> None:
        """Withdraw prefix blocks whose K/V the step did not store."""
        for block, block_hash in published:
            self._pool.unpublish(block, block_hash)

    def _restore(self, seq_id: str, before: Before, swaps: list[tuple[int, int, int]]) -> None:
        """Put back the table (and chain) a sequence had when the step first changed it."""
        table = self._tables[seq_id]
        release = self._pool.release
        for j, old, new in reversed(swaps):
            table[j] = old
            release(new)
        table_len, chain_len = before
        while len(table) > (table_len or 0):
            release(table.pop())
        del self._chains[seq_id][chain_len:]

    def _extend(self, table: list[int], num_blocks: int) -> None:
        take_fresh = self._pool.take_fresh
        while len(table) < num_blocks:
            table.append(take_fresh())
