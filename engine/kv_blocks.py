"""The KV pool's blocks, one by one (``BlockPool``): each block's ref count, fill and prefix
registration, the free list and the cached blocks (least recently used first), and the prefix
hash chain that names a full block by its whole prefix. No sequences here: their block tables
are engine/kv_cache.py's ``BlockManager``, which owns one ``BlockPool`` and is its only user.

Every block is in exactly one state: ``free`` (on the free list), ``used`` (ref count > 0) or
``cached`` (ref count 0 but holding a published full-block prefix, reusable until evicted).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence

from engine.kv_stats import BlockState

__all__ = ["ROOT_HASH", "BlockPool", "prefix_chain"]

ROOT_HASH = -1


def prefix_chain(
    token_ids: Sequence[int],
    block_size: int,
    num_blocks: int,
    parent: int = ROOT_HASH,
    start: int = 0,
) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Full blocks ``start`` to ``num_blocks - 1`` of a prompt as (hash, tokens), each hash chained
    on the one before (``parent``: block ``start - 1``'s): a block's hash names its whole prefix,
    the prefix cache's key."""
    for j in range(start, num_blocks):
        tokens = tuple(token_ids[j * block_size : (j + 1) * block_size])
        parent = hash((parent, tokens))
        yield parent, tokens


class BlockPool:
    """Every block's state and the prefix index (hash → block), for the ``BlockManager``.

    ``ref_count`` and ``fill`` (tokens stored in each block) are read in the manager's hot
    paths as plain lists; every change of state goes through a method here.
    """

    __slots__ = (
        "_block_hash",
        "_block_tokens",
        "_cached",
        "_free",
        "_hash_to_block",
        "block_size",
        "fill",
        "live_tokens",
        "num_blocks",
        "ref_count",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        self.fill = [0] * num_blocks
        self.live_tokens = 0
        """Tokens stored in used blocks."""
        self._block_hash: list[int | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()

    # -- counts and states ----------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._cached)

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

    def hash_of(self, block: int) -> int | None:
        """The prefix hash the block is published under (None: not published)."""
        return self._block_hash[block]

    def published_hash(self, block: int) -> int:
        """The prefix hash of a block known to be published (a prefix-cache hit)."""
        block_hash = self._block_hash[block]
        if block_hash is None:
            raise ValueError(f"block {block} is not published in the prefix index")
        return block_hash

    # -- taking and releasing ---------------------------------------------------------------

    def share(self, block: int) -> None:
        """One more reference to a used or cached block (a cached one becomes used)."""
        if self.ref_count[block] == 0:
            del self._cached[block]
            self.live_tokens += self.fill[block]
        self.ref_count[block] += 1

    def take_fresh(self) -> int:
        """An empty block, referenced once: a free one, else the oldest cached one (evicted)."""
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._cached.popitem(last=False)
            self._unregister(block)
        self.ref_count[block] = 1
        self.fill[block] = 0
        return block

    def take_copy(self, source: int) -> int:
        """A fresh block holding what ``source`` holds (copy-on-write; the runner copies the
        K/V, ``source`` keeps its reference)."""
        block = self.take_fresh()
        self.fill[block] = self.fill[source]
        self.live_tokens += self.fill[block]
        return block

    def release(self, block: int) -> int:
        """Drop one reference; returns 1 when it was the last (the block is then cached if
        published, else free), else 0."""
        self.ref_count[block] -= 1
        if self.ref_count[block] > 0:
            return 0
        self.live_tokens -= self.fill[block]
        if self._block_hash[block] is not None:
            self._cached[block] = None
        else:
            self._to_free_list(block)
        return 1

    def store(self, table: list[int], start: int, end: int) -> None:
        """Positions ``[start, end)`` of the sequence whose blocks are ``table`` hold K/V now.
        One already stored (a forked sequence recomputes its prompt's last token,
        serving/families.py) is not counted twice."""
        size = self.block_size
        fill = self.fill
        stored = fill[table[start // size]] - start % size
        if stored > 0:  # rare: only a fork's recompute
            start += min(stored, end - start)
            if start == end:
                return
        last = (end - 1) // size
        for j in range(start // size, last):
            fill[table[j]] = size
        fill[table[last]] = end - last * size
        self.live_tokens += end - start

    # -- the prefix index -----------------------------------------------------------------

    def match(self, token_ids: Sequence[int], num_blocks: int) -> list[int]:
        """Published blocks holding the first ``num_blocks`` full blocks of ``token_ids``
        (stopping at the first miss; a hit's tokens are checked, not only its hash)."""
        hits: list[int] = []
        for block_hash, tokens in prefix_chain(token_ids, self.block_size, num_blocks):
            block = self._hash_to_block.get(block_hash)
            if block is None or self._block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def publish(self, block: int, block_hash: int, tokens: tuple[int, ...]) -> bool:
        """Index a full block under its prefix hash, unless the hash is taken or the block
        already published; returns whether it was published."""
        if block_hash in self._hash_to_block or self._block_hash[block] is not None:
            return False
        self._hash_to_block[block_hash] = block
        self._block_hash[block] = block_hash
        self._block_tokens[block] = tokens
        return True

    def unpublish(self, block: int, block_hash: int) -> None:
        """Withdraw a block published under ``block_hash`` (nothing if it was evicted and
        reused since); a cached one goes back to the free list."""
        if self._block_hash[block] != block_hash:
            return
        self._unregister(block)
        if self.ref_count[block] == 0 and block in self._cached:
            del self._cached[block]
            self._to_free_list(block)

    # -- maintenance ----------------------------------------------------------------------

    def sweep_unlisted(self) -> int:
        """Put blocks nobody references that are on neither list back on the free list;
        returns how many."""
        listed = set(self._free).union(self._cached)
        unlisted = [b for b in range(self.num_blocks) if self.ref_count[b] == 0 and b not in listed]
        for block in unlisted:
            self._to_free_list(block)
        return len(unlisted)

    def evict_until(self, num_free: int) -> int:
        """Evict cached blocks, oldest first, until ``num_free`` are free; returns how many."""
        evicted = 0
        while len(self._free) < num_free and self._cached:
            block, _ = self._cached.popitem(last=False)
            self._to_free_list(block)
            evicted += 1
        return evicted

    def problems(self, refs: list[int]) -> list[str]:
        """Where the pool contradicts itself or ``refs`` (the references the block tables
        hold, per block); empty when it is sound."""
        problems: list[str] = []
        if refs != self.ref_count:
            problems.append("ref counts disagree with the block tables")
        free = set(self._free)
        if len(free) != len(self._free):
            problems.append("a block is twice on the free list")
        for block in range(self.num_blocks):
            states = (block in free) + (block in self._cached) + (self.ref_count[block] > 0)
            if states != 1:
                problems.append(f"block {block} is in {states} states")
        if self.num_free + self.num_used + self.num_cached != self.num_blocks:
            problems.append("free + used + cached != total")
        live = sum(self.fill[b] for b in range(self.num_blocks) if self.ref_count[b] > 0)
        if live != self.live_tokens:
            problems.append(f"live tokens {self.live_tokens} != {live}")
        return problems

    def stale_hashes(self) -> list[int]:
        """Hashes the index maps to a block no longer published under them."""
        return [h for h, b in self._hash_to_block.items() if self._block_hash[b] != h]

    # -- internals ------------------------------------------------------------------------

    def _unregister(self, block: int) -> None:
        block_hash = self._block_hash[block]
        if block_hash is not None and self._hash_to_block.get(block_hash) == block:
            del self._hash_to_block[block_hash]
        self._block_hash[block] = None
        self._block_tokens[block] = None

    def _to_free_list(self, block: int) -> None:
        self._unregister(block)
        self.fill[block] = 0
        self._free.append(block)
