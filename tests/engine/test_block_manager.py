"""BlockManager properties under random interleavings, checked against a shadow of the KV
contents: every live sequence must read back exactly its own tokens."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from engine.kv_cache import BlockManager, BlockState

BLOCK = 4
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=14)


class BlockManagerMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(num_blocks=st.integers(8, 24), reserve=st.sampled_from([0.0, 0.1, 0.25]))
    def setup(self, num_blocks: int, reserve: float) -> None:
        self.bm = BlockManager(num_blocks, BLOCK, memory_reserve=reserve)
        self.tokens: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.slots: dict[int, list[int | None]] = {b: [None] * BLOCK for b in range(num_blocks)}
        self.counter = 0

    def _new_id(self) -> str:
        self.counter += 1
        return f"s{self.counter}"

    def _write(self, seq_id: str, start: int, end: int) -> None:
        for block_src, block_dst in self.bm.take_copies():
            self.slots[block_dst] = list(self.slots[block_src])
        table = self.bm.tables[seq_id]
        for pos in range(start, end):
            self.slots[table[pos // BLOCK]][pos % BLOCK] = self.tokens[seq_id][pos]
        self.bm.register(seq_id, self.tokens[seq_id], end)
        self.bm.confirm()
        self.bm.commit(seq_id, start, end)
        self.computed[seq_id] = end

    @rule(target=seqs, tokens=TOKENS)
    def admit(self, tokens: list[int]):
        hits = self.bm.match_prefix(tokens)
        if not self.bm.can_admit(hits, len(tokens)):
            before = self.bm.admissible
            assert self.bm.blocks_to_admit(hits, len(tokens)) > before
            return multiple()
        seq_id = self._new_id()
        self.tokens[seq_id] = list(tokens)
        cached = self.bm.allocate(seq_id, tokens, len(tokens), hits)
        assert self.bm.num_free + self.bm.num_cached >= self.bm.reserved, "admitted into reserve"
        assert cached == len(hits) * BLOCK and cached < len(tokens)
        self.computed[seq_id] = cached
        self._write(seq_id, cached, len(tokens))
        return seq_id

    @rule(seq=seqs, extra=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def append(self, seq: str, extra: list[int]) -> None:
        assume(seq in self.tokens)
        start = self.computed[seq]
        others = {s: list(t) for s, t in self.bm.tables.items() if s != seq}
        if not self.bm.grow(seq, start, start + len(extra)):
            return
        assert {s: t for s, t in self.bm.tables.items() if s != seq} == others, (
            "growing one sequence changed another's table"
        )
        self.tokens[seq].extend(extra)
        self._write(seq, start, start + len(extra))

    @rule(target=seqs, parent=seqs)
    def fork(self, parent: str):
        assume(parent in self.tokens)
        child = self._new_id()
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.computed[child] = self.computed[parent]
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq: str) -> None:
        assume(seq in self.tokens)
        self.bm.free(seq)
        del self.tokens[seq], self.computed[seq]

    @rule(seq=consumes(seqs), live_fraction=st.booleans())
    def leak_then_reclaim(self, seq: str, live_fraction: bool) -> None:
        """Forget a sequence without freeing it; reclaim must take its blocks back and leave
        every live sequence alone."""
        assume(seq in self.tokens)
        del self.tokens[seq], self.computed[seq]
        live_tables = {s: list(self.bm.tables[s]) for s in self.tokens}
        result = self.bm.reclaim(self.tokens.keys())
        assert seq not in self.bm.tables
        assert {s: self.bm.tables[s] for s in self.tokens} == live_tables
        assert result.freed >= 0 and result.evicted >= 0
        if live_fraction:
            assert self.bm.reclaim(self.tokens.keys()).freed == 0, "a second sweep finds nothing"

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        if not hasattr(self, "bm"):
            return
        self.bm.check_integrity()
        bm = self.bm
        assert bm.num_free + bm.num_used + bm.num_cached == bm.num_blocks
        states = [bm.state_of(b) for b in range(bm.num_blocks)]
        assert states.count(BlockState.USED) == bm.num_used

    @invariant()
    def every_sequence_reads_back_its_tokens(self) -> None:
        if not hasattr(self, "bm"):
            return
        for seq_id, tokens in self.tokens.items():
            table = self.bm.tables[seq_id]
            stored = [self.slots[table[p // BLOCK]][p % BLOCK] for p in range(len(tokens))]
            assert stored == tokens, f"{seq_id} reads {stored}, wrote {tokens}"


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40)


def test_prefix_blocks_are_shared_and_counted_once():
    bm = BlockManager(16, BLOCK, memory_reserve=0.0)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    bm.allocate("a", prompt, len(prompt))
    bm.register("a", prompt, len(prompt))
    bm.commit("a", 0, len(prompt))
    hits = bm.match_prefix(prompt)
    assert hits == bm.tables["a"][:2]
    bm.allocate("b", prompt, len(prompt), hits)
    assert [bm.ref_count[b] for b in hits] == [2, 2]
    assert bm.num_used == 4  # two shared full blocks, one partial block each
    bm.free("a")
    bm.free("b")
    assert bm.num_cached == 2 and bm.num_used == 0
    assert bm.match_prefix(prompt) == hits, "freed prefix blocks stay reusable"


def test_reserve_guard_evicts_cached_blocks_oldest_first():
    bm = BlockManager(10, BLOCK, memory_reserve=0.5)
    for name, first in (("old", 1), ("new", 2)):
        tokens = [first] * 9
        bm.allocate(name, tokens, 9)
        bm.register(name, tokens, 9)
        bm.commit(name, 0, 9)
        bm.free(name)
    assert bm.num_cached == 4 and bm.num_free == 6
    assert bm.evict_to_reserve() == 0, "free blocks already cover the reserve"
    bm.allocate("x", [9] * 8, 8)
    assert bm.num_free == 4
    assert bm.evict_to_reserve() == 1
    assert len(bm.match_prefix([2] * 9)) == 2, "the newer prefix is untouched"
    assert len(bm.match_prefix([1] * 9)) == 1, "the oldest prefix loses its tail block first"


def test_reclaim_frees_unreferenced_orphans():
    bm = BlockManager(8, BLOCK, memory_reserve=0.0)
    bm.allocate("a", [1, 2, 3], 3)
    orphan = bm.tables["a"][0]
    bm.tables.pop("a")
    bm.chains.pop("a")
    bm.ref_count[orphan] = 0  # a block nobody references but nobody returned
    result = bm.reclaim([])
    assert result.freed == 1
    bm.check_integrity()


@pytest.mark.parametrize("block_size", [16, 32, 64])
@given(lengths=st.lists(st.integers(1, 200), min_size=1, max_size=6))
def test_utilization_counts_stored_tokens_over_held_slots(block_size: int, lengths: list[int]):
    bm = BlockManager(6 * -(-200 // 16), block_size, memory_reserve=0.0)  # room for any draw
    for i, n in enumerate(lengths):
        tokens = list(range(i * 1000, i * 1000 + n))
        bm.allocate(f"s{i}", tokens, n)
        bm.register(f"s{i}", tokens, n)
        bm.commit(f"s{i}", 0, n)
    stats = bm.stats()
    assert stats.live_tokens == sum(lengths)
    assert stats.held_slots == sum(-(-n // block_size) for n in lengths) * block_size
    assert stats.utilization == pytest.approx(stats.live_tokens / stats.held_slots)


def test_allocating_past_the_pool_is_refused_and_changes_nothing():
    bm = BlockManager(4, 16, memory_reserve=0.0)
    bm.allocate("a", list(range(40)), 40)
    before = bm.stats()
    with pytest.raises(ValueError, match="needs 2 blocks, 1 are not in use"):
        bm.allocate("b", list(range(100, 120)), 20)
    assert bm.stats() == before and "b" not in bm.tables
    bm.check_integrity()
