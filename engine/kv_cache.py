"""Paged KV cache: the block pool's bookkeeping (BlockManager) and the tensors it indexes.

Every block is in exactly one state: ``free`` (on the free list), ``used`` (ref count > 0) or
``cached`` (ref count 0 but holding a registered full-block prefix, reusable until evicted,
least recently used first). ``reserved`` is not a state: it is how many free-or-cached blocks
admission of new work must leave alone. Running sequences may grow into the reserve.
"""

from __future__ import annotations

import enum
import math
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

ROOT_HASH = -1


class BlockState(enum.Enum):
    FREE = "free"
    USED = "used"
    CACHED = "cached"


@dataclass(frozen=True, slots=True)
class KVStats:
    block_size: int
    total: int
    free: int
    used: int
    cached: int
    reserved: int
    live_tokens: int
    held_slots: int

    @property
    def utilization(self) -> float:
        """Tokens stored / slots held by sequences: padding and half-empty blocks lower it."""
        return self.live_tokens / self.held_slots if self.held_slots else 0.0

    @property
    def usage(self) -> float:
        return self.used / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "block_size": self.block_size,
            "total": self.total,
            "free": self.free,
            "used": self.used,
            "cached": self.cached,
            "reserved": self.reserved,
            "live_tokens": self.live_tokens,
            "held_slots": self.held_slots,
            "utilization": self.utilization,
            "usage": self.usage,
        }


class ReclaimResult(NamedTuple):
    freed: int
    evicted: int
    free_before: int
    free_after: int
    reserve_breached: bool
    duration_s: float


class BlockManager:
    """Block tables, ref counts, prefix sharing (chained full-block hashes) and the reserve."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        memory_reserve: float = 0.10,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.memory_reserve = memory_reserve
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.fill = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.tables: dict[str, list[int]] = {}
        self.chains: dict[str, list[int]] = {}
        self.live_tokens = 0
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._copies: list[tuple[int, int]] = []
        self._unconfirmed: list[int] = []

    # -- counts -------------------------------------------------------------------------

    @property
    def reserved(self) -> int:
        return math.ceil(self.memory_reserve * self.num_blocks - 1e-9)

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
            live_tokens=self.live_tokens,
            held_slots=used * self.block_size,
        )

    def state_of(self, block: int) -> BlockState:
        if self.ref_count[block] > 0:
            return BlockState.USED
        return BlockState.CACHED if block in self._cached else BlockState.FREE

    def block_map(self) -> str:
        """One character per block: ``.`` free, ``#`` used, ``c`` cached."""
        chars = ["#" if r > 0 else "." for r in self.ref_count]
        for block in self._cached:
            chars[block] = "c"
        return "".join(chars)

    # -- prefix cache -----------------------------------------------------------------

    def _chain(self, token_ids: Sequence[int], num_blocks: int) -> Iterable[tuple[int, tuple]]:
        parent = ROOT_HASH
        size = self.block_size
        for j in range(num_blocks):
            tokens = tuple(token_ids[j * size : (j + 1) * size])
            parent = hash((parent, tokens))
            yield parent, tokens

    def match_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Cached blocks holding this prompt's leading full blocks.

        The block holding the last token is never matched: its logits must be computed, and
        a shared block is never written.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        for block_hash, tokens in self._chain(token_ids, (len(token_ids) - 1) // self.block_size):
            block = self.hash_to_block.get(block_hash)
            if block is None or self.block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def blocks_to_admit(self, hits: list[int], num_tokens: int) -> int:
        """Free-or-cached blocks that admitting ``num_tokens`` with these hits would take."""
        fresh = max(0, self.blocks_for(num_tokens) - len(hits))
        return fresh + sum(1 for b in hits if self.ref_count[b] == 0)

    def can_admit(self, hits: list[int], num_tokens: int) -> bool:
        return self.blocks_to_admit(hits, num_tokens) <= self.admissible

    # -- allocation ---------------------------------------------------------------------

    def allocate(
        self, seq_id: str, token_ids: Sequence[int], num_tokens: int, hits: list[int] | None = None
    ) -> int:
        """Give a new sequence a table covering ``num_tokens`` slots; returns cached tokens.

        The caller checks ``can_admit`` first (admission respects the reserve).
        """
        if seq_id in self.tables:
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
        self.tables[seq_id] = table
        self.chains[seq_id] = [self.block_hash[b] for b in hits]  # type: ignore[misc]
        self._extend(table, self.blocks_for(num_tokens))
        return len(hits) * self.block_size

    def grow(self, seq_id: str, start: int, end: int) -> bool:
        """Make slots ``[start, end)`` writable: add blocks, copy shared ones (copy-on-write).

        May take reserve blocks. Returns False, changing nothing, when the pool is too empty.
        """
        table = self.tables[seq_id]
        size = self.block_size
        needed = self.blocks_for(end)
        shared = [
            j for j in range(start // size, min(len(table), needed)) if self.ref_count[table[j]] > 1
        ]
        if max(0, needed - len(table)) + len(shared) > len(self._free) + len(self._cached):
            return False
        for j in shared:
            old = table[j]
            new = self._take_fresh()
            self.fill[new] = self.fill[old]
            self.live_tokens += self.fill[new]
            self._copies.append((old, new))
            self.ref_count[old] -= 1
            table[j] = new
        self._extend(table, needed)
        return True

    def register(self, seq_id: str, token_ids: Sequence[int], num_tokens: int) -> None:
        """Publish the full blocks among the first ``num_tokens`` for prefix sharing.

        Called when the step that computes them is scheduled, so requests admitted later in
        the same step already share them: every layer writes the step's K/V before it
        attends. ``confirm()`` after the forward, ``rollback()`` if it failed.
        """
        if not self.enable_prefix_caching:
            return
        table = self.tables[seq_id]
        chain = self.chains[seq_id]
        parent = chain[-1] if chain else ROOT_HASH
        size = self.block_size
        for j in range(len(chain), num_tokens // size):
            tokens = tuple(token_ids[j * size : (j + 1) * size])
            parent = hash((parent, tokens))
            chain.append(parent)
            block = table[j]
            if parent not in self.hash_to_block and self.block_hash[block] is None:
                self.hash_to_block[parent] = block
                self.block_hash[block] = parent
                self.block_tokens[block] = tokens
                self._unconfirmed.append(block)

    def confirm(self) -> None:
        self._unconfirmed.clear()

    def rollback(self) -> None:
        """The step that would have filled freshly published blocks did not run."""
        for block in self._unconfirmed:
            self._unregister(block)
            if self.ref_count[block] == 0 and block in self._cached:
                del self._cached[block]
                self._to_free_list(block)
        self._unconfirmed.clear()
        for chain in self.chains.values():
            chain.clear()

    def commit(self, seq_id: str, start: int, end: int) -> None:
        """Tokens ``[start, end)`` of the sequence now have K/V stored."""
        table = self.tables[seq_id]
        size = self.block_size
        for j in range(start // size, self.blocks_for(end)):
            self.fill[table[j]] = min(size, end - j * size)
        self.live_tokens += end - start

    def free(self, seq_id: str) -> int:
        """Release a sequence's blocks (idempotent); returns how many reached ref count 0."""
        table = self.tables.pop(seq_id, None)
        self.chains.pop(seq_id, None)
        if table is None:
            return 0
        return sum(self._release(b) for b in reversed(table))

    def trim(self, seq_id: str, num_tokens: int) -> int:
        """Give back blocks beyond what ``num_tokens`` need (a padded reservation, say)."""
        table = self.tables[seq_id]
        keep = self.blocks_for(num_tokens)
        released = 0
        while len(table) > keep:
            released += self._release(table.pop())
        return released

    def fork(self, parent_id: str, child_id: str) -> None:
        """The child shares every block of the parent; writes copy first."""
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} already holds blocks")
        table = self.tables[parent_id]
        for block in table:
            self.ref_count[block] += 1
        self.tables[child_id] = list(table)
        self.chains[child_id] = list(self.chains[parent_id])

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self._copies = self._copies, []
        return copies

    # -- maintenance --------------------------------------------------------------------

    def reclaim(self, live_ids: Iterable[str]) -> ReclaimResult:
        """Free tables of sequences that are not live and blocks nobody references.

        Never touches a live sequence's blocks; the prefix cache is left alone unless free
        blocks fall under the reserve (then the oldest cached blocks are evicted).
        """
        started = time.perf_counter()
        free_before = len(self._free)
        live = set(live_ids)
        freed = sum(self.free(seq_id) for seq_id in [s for s in self.tables if s not in live])
        accounted = self._free_set().union(self._cached)
        for block in range(self.num_blocks):
            if self.ref_count[block] == 0 and block not in accounted:
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

    def check_integrity(self) -> None:
        """Raise AssertionError when the bookkeeping contradicts itself (used by tests)."""
        refs = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                refs[block] += 1
        assert refs == self.ref_count, "ref counts disagree with the block tables"
        free = self._free_set()
        assert len(free) == len(self._free), "a block is twice on the free list"
        for block in range(self.num_blocks):
            states = (block in free) + (block in self._cached) + (self.ref_count[block] > 0)
            assert states == 1, f"block {block} is in {states} states"
        assert self.num_free + self.num_used + self.num_cached == self.num_blocks
        live = sum(self.fill[b] for b in range(self.num_blocks) if self.ref_count[b] > 0)
        assert live == self.live_tokens, f"live tokens {self.live_tokens} != {live}"
        for block_hash, block in self.hash_to_block.items():
            assert self.block_hash[block] == block_hash, "hash index points at a stale block"

    # -- internals ----------------------------------------------------------------------

    def _free_set(self) -> set[int]:
        return set(self._free)

    def _share(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self._cached[block]
            self.live_tokens += self.fill[block]
        self.ref_count[block] += 1

    def _take_fresh(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._cached.popitem(last=False)
            self._unregister(block)
        self.ref_count[block] = 1
        self.fill[block] = 0
        return block

    def _extend(self, table: list[int], num_blocks: int) -> None:
        while len(table) < num_blocks:
            table.append(self._take_fresh())

    def _release(self, block: int) -> int:
        self.ref_count[block] -= 1
        if self.ref_count[block] > 0:
            return 0
        self.live_tokens -= self.fill[block]
        if self.block_hash[block] is not None:
            self._cached[block] = None
        else:
            self._to_free_list(block)
        return 1

    def _unregister(self, block: int) -> None:
        block_hash = self.block_hash[block]
        if block_hash is not None and self.hash_to_block.get(block_hash) == block:
            del self.hash_to_block[block_hash]
        self.block_hash[block] = None
        self.block_tokens[block] = None

    def _to_free_list(self, block: int) -> None:
        self._unregister(block)
        self.fill[block] = 0
        self._free.append(block)


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` pool per layer.

    Stored head-major (``[2, num_kv_heads, num_blocks, block_size, head_dim]`` underneath):
    a decode batch's blocks of one head then gather into one contiguous buffer, and the
    kernels, which honour strides, read the logical view. Zeroed, not empty: a masked slot
    still enters ``0 × value`` and must not hold NaN.
    """
    shape = (2, num_kv_heads, num_blocks, block_size, head_dim)
    return [
        torch.zeros(shape, dtype=dtype, device=device).permute(0, 2, 3, 1, 4)
        for _ in range(num_layers)
    ]


def kv_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element
