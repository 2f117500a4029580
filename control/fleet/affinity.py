"""The router's memory of where each prompt prefix was sent (plain Python, no Ray).

The client's probe asks each replica what its prefix cache holds, and that answer is the truth;
but on a loaded machine a replica may not answer within ``--prefix-probe-timeout-s``. For such a
replica the router falls back on what it remembers: the full prompt blocks of the requests it
sent there (as chained block hashes, the way ``BlockManager`` keys its cache), newest kept,
oldest forgotten past ``capacity`` blocks. A memory can be stale (the replica may have evicted
the blocks since), so it only stands in for a missing answer, never overrides one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from engine.kv_cache import prefix_chain

CAPACITY_BLOCKS = 65_536
"""Prefix blocks remembered across all replicas (each an int hash and a few replica ids)."""


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The prefix cache's keys of the prompt's full blocks before the one holding its last token
    (the blocks ``BlockManager.match_prefix`` can hit): each covers every token up to it."""
    num_blocks = (len(token_ids) - 1) // block_size
    return tuple(block_hash for block_hash, _ in prefix_chain(token_ids, block_size, num_blocks))


class PrefixAffinity:
    """Which replicas were sent each prefix block (a hash chain: a block's hash names its
    whole prefix, so a match of block ``j`` is a match of every block before it)."""

    def __init__(self, capacity: int = CAPACITY_BLOCKS) -> None:
        self.capacity = capacity
        self._sent: OrderedDict[int, set[str]] = OrderedDict()
        self._replicas: set[str] = set()

    def __len__(self) -> int:
        return len(self._sent)

    def record(self, hashes: Sequence[int], replica: str) -> None:
        self._replicas.add(replica)
        for block in hashes:
            self._sent.setdefault(block, set()).add(replica)
            self._sent.move_to_end(block)
        while len(self._sent) > self.capacity:
            self._sent.popitem(last=False)

    def hits(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per replica, the leading blocks of this prompt last sent there (absent: none)."""
        found: dict[str, int] = {}
        live: set[str] | None = None
        for depth, block in enumerate(hashes, start=1):
            sent = self._sent.get(block, set())
            live = set(sent) if live is None else live & sent
            if not live:
                break
            for replica in live:
                found[replica] = depth
        return found

    def keep_only(self, live: set[str]) -> None:
        """Forget the replicas that left (drained, died): their caches went with them."""
        replicas, self._replicas = self._replicas - live, self._replicas & live
        if not replicas:
            return
        for block in list(self._sent):
            sent = self._sent[block]
            sent -= replicas
            if not sent:
                del self._sent[block]


def merged(probed: Mapping[str, int], remembered: Mapping[str, int]) -> dict[str, int]:
    """The probe's answer for each replica that gave one, the memory for the others."""
    return {**remembered, **probed}
