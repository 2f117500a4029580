"""Paged KV cache bookkeeping: the prefix hash chain, the block table view and the block pool's
manager (BlockManager). One step's changes to it are engine/kv_step.py's ``StepChanges``, the
manager's one friend; the tensors it indexes are engine/kv_pool.py's. No torch here.

Every block is in exactly one state: ``free`` (on the free list), ``used`` (ref count > 0) or
``cached`` (ref count 0 but holding a registered full-block prefix, reusable until evicted,
least recently used first). ``reserved`` is not a state: it is how many free-or-cached blocks
admission of new work must leave alone. Running sequences may grow into the reserve.

The manager's tables, chains, fill and ref counts are its own: callers read them through
``holds``, ``table`` (a read-only live view), ``stored_tokens``, ``ref_count`` and ``stats``.
Inside an engine step, blocks change only through the step's ``StepChanges`` (opened with
``begin_step``): the policy proposes allocations, growth and prefix registrations into it,
the engine commits the rows that ran and rolls back the rest.
"""

from __future__ import annotations

import time
from collections import OrderedDict, abc, deque
from collections.abc import Iterable, Iterator, Sequence

from engine.kv_budget import reserved_blocks
from engine.kv_stats import BlockState, KVStats, ReclaimResult
from engine.kv_step import Before, StepChanges

__all__ = ["ROOT_HASH", "BlockManager", "BlockTable", "prefix_chain"]

ROOT_HASH = -1


def prefix_chain(
    token_ids: Sequence[int],
    block_size: int,
    num_blocks: int,
    parent: int = ROOT_HASH,
    start: int = 0,
) -> Iterator[tuple[int, tuple]]:
    """Full blocks ``start`` to ``num_blocks - 1`` of a prompt as (hash, tokens), each hash chained
    on the one before (``parent``: block ``start - 1``'s): a block's hash names its whole prefix,
    the prefix cache's key."""
    for j in range(start, num_blocks):
        tokens = tuple(token_ids[j * block_size : (j + 1) * block_size])
        parent = hash((parent, tokens))
        yield parent, tokens


class BlockTable(abc.Sequence[int]):
    """A read-only, live view of one sequence's block table (what the runner reads as
    ``seq.block_table``). Slices are plain lists."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks: list[int]) -> None:
        self._blocks = blocks

    def __getitem__(self, index):  # type: ignore[override]
        return self._blocks[index]

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self._blocks)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockTable):
            return self._blocks == other._blocks
        return isinstance(other, abc.Sequence) and list(self._blocks) == list(other)

    def __repr__(self) -> str:
        return f"BlockTable({self._blocks!r})"


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
        self._ref_count = [0] * num_blocks
        self._fill = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._tables: dict[str, list[int]] = {}
        self._chains: dict[str, list[int]] = {}
        self._live_tokens = 0
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._step: StepChanges | None = None

    # -- counts -------------------------------------------------------------------------

    @property
    def reserved(self) -> int:
        return reserved_blocks(self.num_blocks, self.memory_reserve)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._cached)

    @property
    def live_tokens(self) -> int:
        return self._live_tokens

    @property
    def admissible(self) -> int:
        """Blocks new work may still take without entering the reserve."""
        return max(0, len(self._free) + len(self._cached) - self.reserved)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def stats(self) -> KVStats:
        used = self.num_used
        return KVStats(
            block_size=self.block_size,
            total=self.num_blocks,
            free=len(self._free),
            used=used,
            cached=len(self._cached),
            reserved=self.reserved,
            live_tokens=self._live_tokens,
            held_slots=used * self.block_size,
        )

    def state_of(self, block: int) -> BlockState:
        if self._ref_count[block] > 0:
            return BlockState.USED
        return BlockState.CACHED if block in self._cached else BlockState.FREE

    def ref_count(self, block: int) -> int:
        return self._ref_count[block]

    def block_map(self) -> str:
        """One character per block: ``.`` free, ``#`` used, ``c`` cached."""
        chars = ["#" if r > 0 else "." for r in self._ref_count]
        for block in self._cached:
            chars[block] = "c"
        return "".join(chars)

    # -- per sequence -------------------------------------------------------------------

    def holds(self, seq_id: str) -> bool:
        """Whether the sequence holds a block table (it may be empty)."""
        return seq_id in self._tables

    def table(self, seq_id: str) -> BlockTable:
        """The sequence's blocks in logical order, as a read-only live view."""
        return BlockTable(self._tables[seq_id])

    def stored_tokens(self, seq_id: str) -> int:
        """Tokens whose K/V is stored in the sequence's blocks (0 when it holds none)."""
        return sum(self._fill[b] for b in self._tables.get(seq_id, ()))

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
        hits: list[int] = []
        size = self.block_size
        for block_hash, tokens in prefix_chain(token_ids, size, (len(token_ids) - 1) // size):
            block = self._hash_to_block.get(block_hash)
            if block is None or self._block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def blocks_to_admit(self, hits: list[int], num_tokens: int) -> int:
        """Free-or-cached blocks that admitting ``num_tokens`` with these hits would take."""
        fresh = max(0, self.blocks_for(num_tokens) - len(hits))
        return fresh + sum(1 for b in hits if self._ref_count[b] == 0)

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
        return sum(self._release(b) for b in reversed(table))

    def trim(self, seq_id: str, num_tokens: int) -> int:
        """Give back blocks beyond what ``num_tokens`` need (a padded reservation, say)."""
        self._between_steps("trim")
        table = self._tables[seq_id]
        keep = self.blocks_for(num_tokens)
        released = 0
        while len(table) > keep:
            released += self._release(table.pop())
        return released

    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares every block of the parent; writes copy first."""
        self._between_steps("fork")
        if child_id in self._tables:
            raise ValueError(f"sequence {child_id!r} already holds blocks")
        table = self._tables[parent_id]
        for block in table:
            self._ref_count[block] += 1
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
        free_before = len(self._free)
        live = set(live_ids)
        freed = sum(self.free(seq_id) for seq_id in [s for s in self._tables if s not in live])
        accounted = set(self._free).union(self._cached)
        for block in range(self.num_blocks):
            if self._ref_count[block] == 0 and block not in accounted:
                self._to_free_list(block)
                freed += 1
        evicted = self.evict_to_reserve()
        return ReclaimResult(
            freed=freed,
            evicted=evicted,
            free_before=free_before,
            free_after=len(self._free),
            reserve_breached=len(self._free) + len(self._cached) < self.reserved,
            duration_s=time.perf_counter() - started,
        )

    def evict_to_reserve(self) -> int:
        """The memory-reserve guard: evict cached blocks, oldest first, until free ≥ reserve."""
        evicted = 0
        while len(self._free) < self.reserved and self._cached:
            block, _ = self._cached.popitem(last=False)
            self._to_free_list(block)
            evicted += 1
        return evicted

    def integrity_problems(self) -> list[str]:
        """Where the bookkeeping contradicts itself; empty when it is sound. Cheap enough to
        run at a step boundary on a live server (``GET /admin/kv/integrity``)."""
        problems: list[str] = []
        refs = [0] * self.num_blocks
        for table in self._tables.values():
            for block in table:
                refs[block] += 1
        for block in self._step._sources() if self._step else ():
            refs[block] += 1  # a copy-on-write source stays referenced until the step settles
        if refs != self._ref_count:
            problems.append("ref counts disagree with the block tables")
        free = set(self._free)
        if len(free) != len(self._free):
            problems.append("a block is twice on the free list")
        for block in range(self.num_blocks):
            states = (block in free) + (block in self._cached) + (self._ref_count[block] > 0)
            if states != 1:
                problems.append(f"block {block} is in {states} states")
        if self.num_free + self.num_used + self.num_cached != self.num_blocks:
            problems.append("free + used + cached != total")
        live = sum(self._fill[b] for b in range(self.num_blocks) if self._ref_count[b] > 0)
        if live != self._live_tokens:
            problems.append(f"live tokens {self._live_tokens} != {live}")
        return problems

    def check_integrity(self) -> None:
        """Raise AssertionError naming every contradiction in the bookkeeping (tests use it)."""
        if problems := self.integrity_problems():
            raise AssertionError("; ".join(problems))
        for block_hash, block in self._hash_to_block.items():
            assert self._block_hash[block] == block_hash, "hash index points at a stale block"

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
        table: list[int] = []
        for block in hits:
            self._share(block)
            table.append(block)
        self._tables[seq_id] = table
        self._chains[seq_id] = [self._block_hash[b] for b in hits]  # type: ignore[misc]
        self._extend(table, self.blocks_for(num_tokens))
        return len(hits) * self.block_size

    def _writable(self, seq_id: str, start: int, end: int) -> bool:
        """Whether slots ``[start, end)`` are already held and unshared (growing changes
        nothing). O(blocks written), so a decode checks one block."""
        table = self._tables[seq_id]
        size = self.block_size
        if end > len(table) * size:
            return False
        ref_count = self._ref_count
        first, last = start // size, (end - 1) // size
        if first == last:
            return ref_count[table[first]] <= 1
        return all(ref_count[table[j]] <= 1 for j in range(first, last + 1))

    def _grow(self, seq_id: str, start: int, end: int, swaps: list[tuple[int, int, int]]) -> bool:
        table = self._tables[seq_id]
        size = self.block_size
        needed = self.blocks_for(end)
        shared = [
            j
            for j in range(start // size, min(len(table), needed))
            if self._ref_count[table[j]] > 1
        ]
        if max(0, needed - len(table)) + len(shared) > len(self._free) + len(self._cached):
            return False
        for j in shared:
            old = table[j]
            new = self._take_fresh()
            self._fill[new] = self._fill[old]
            self._live_tokens += self._fill[new]
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
        published = []
        fresh = prefix_chain(token_ids, size, num_tokens // size, parent, start=len(chain))
        for j, (parent, tokens) in enumerate(fresh, start=len(chain)):
            chain.append(parent)
            block = table[j]
            if parent not in self._hash_to_block and self._block_hash[block] is None:
                self._hash_to_block[parent] = block
                self._block_hash[block] = parent
                self._block_tokens[block] = tokens
                published.append((block, parent))
        return published

    def _unpublish(self, published: list[tuple[int, int]]) -> None:
        """Withdraw prefix blocks whose K/V the step did not store."""
        for block, block_hash in published:
            if self._block_hash[block] != block_hash:
                continue  # evicted and reused since
            self._unregister(block)
            if self._ref_count[block] == 0 and block in self._cached:
                del self._cached[block]
                self._to_free_list(block)

    def _store(self, seq_id: str, start: int, end: int) -> None:
        """Positions ``[start, end)`` hold K/V now. One already stored (a forked sequence
        recomputes its prompt's last token, engine/families.py) is not counted twice."""
        table = self._tables[seq_id]
        size = self.block_size
        fill = self._fill
        stored = fill[table[start // size]] - start % size
        if stored > 0:  # rare: only a fork's recompute
            start += min(stored, end - start)
            if start == end:
                return
        last = (end - 1) // size
        for j in range(start // size, last):
            fill[table[j]] = size
        fill[table[last]] = end - last * size
        self._live_tokens += end - start

    def _restore(self, seq_id: str, before: Before, swaps: list[tuple[int, int, int]]) -> None:
        """Put back the table (and chain) a sequence had when the step first changed it."""
        table = self._tables[seq_id]
        for j, old, new in reversed(swaps):
            table[j] = old
            self._release(new)
        table_len, chain_len = before
        while len(table) > (table_len or 0):
            self._release(table.pop())
        del self._chains[seq_id][chain_len:]

    def _share(self, block: int) -> None:
        if self._ref_count[block] == 0:
            del self._cached[block]
            self._live_tokens += self._fill[block]
        self._ref_count[block] += 1

    def _take_fresh(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._cached.popitem(last=False)
            self._unregister(block)
        self._ref_count[block] = 1
        self._fill[block] = 0
        return block

    def _extend(self, table: list[int], num_blocks: int) -> None:
        while len(table) < num_blocks:
            table.append(self._take_fresh())

    def _release(self, block: int) -> int:
        self._ref_count[block] -= 1
        if self._ref_count[block] > 0:
            return 0
        self._live_tokens -= self._fill[block]
        if self._block_hash[block] is not None:
            self._cached[block] = None
        else:
            self._to_free_list(block)
        return 1

    def _unregister(self, block: int) -> None:
        block_hash = self._block_hash[block]
        if block_hash is not None and self._hash_to_block.get(block_hash) == block:
            del self._hash_to_block[block_hash]
        self._block_hash[block] = None
        self._block_tokens[block] = None

    def _to_free_list(self, block: int) -> None:
        self._unregister(block)
        self._fill[block] = 0
        self._free.append(block)
