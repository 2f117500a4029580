"""BlockManager properties under random interleavings, checked against a shadow of the KV
contents: every live sequence must read back exactly its own tokens, and every prefix the
cache offers must hold the tokens it is keyed by.

Each engine step is modelled as the engine runs it: the policy proposes admissions, growth
and prefix registrations into the step's ``StepChanges`` (and may preempt, never in the same
step as an admission), the runner copies blocks and writes K/V, then the step is committed,
rolled back as a whole (the forward wrote garbage), or partly committed (some rows failed:
their changes roll back and the engine frees their sequences).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.kv_cache import BlockManager
from engine.kv_stats import BlockState

BLOCK = 4
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=14)
GARBAGE = -1
OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "extend", "preempt"]), TOKENS, st.integers(0, 1 << 16)),
    min_size=1,
    max_size=5,
)


def _has_sequences(machine: BlockManagerMachine) -> bool:
    return bool(machine.tokens)


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(8, 24), reserve=st.sampled_from([0.0, 0.1, 0.25]))
    def setup(self, num_blocks: int, reserve: float) -> None:
        self.bm = BlockManager(num_blocks, BLOCK, memory_reserve=reserve)
        self.tokens: dict[str, list[int]] = {}
        """Live sequences: the tokens whose K/V they have stored."""
        self.slots: dict[int, list[int | None]] = {b: [None] * BLOCK for b in range(num_blocks)}
        self.probes: list[list[int]] = []
        self.counter = 0

    def _new_id(self) -> str:
        self.counter += 1
        return f"s{self.counter}"

    @rule(ops=OPS, outcome=st.sampled_from(["commit", "rollback", "partial"]), mask=st.integers())
    def step(self, ops: list[tuple[str, list[int], int]], outcome: str, mask: int) -> None:
        bm = self.bm
        before = {s: list(bm.table(s)) for s in self.tokens}
        changes = bm.begin_step()
        rows: dict[str, tuple[int, int, list[int]]] = {}
        admitted: list[str] = []
        preempted = False
        for kind, extra, pick in ops:
            live = sorted(s for s in self.tokens if s not in rows)
            if kind == "admit" and not preempted:
                hits = bm.match_prefix(extra)
                if not bm.can_admit(hits, len(extra)):
                    assert bm.blocks_to_admit(hits, len(extra)) > bm.admissible
                    continue
                seq = self._new_id()
                cached = changes.allocate(seq, extra, len(extra), hits)
                assert bm.num_free + bm.num_cached >= bm.reserved, "admitted into the reserve"
                assert cached == len(hits) * BLOCK and cached < len(extra)
                changes.register(seq, extra, len(extra))
                rows[seq] = (cached, len(extra), list(extra))
                admitted.append(seq)
            elif kind == "extend" and live:
                seq = live[pick % len(live)]
                start, full = len(self.tokens[seq]), self.tokens[seq] + extra
                others = {s: list(bm.table(s)) for s in bm.holders() if s != seq}
                if not changes.grow(seq, start, len(full)):
                    continue
                assert {s: list(bm.table(s)) for s in bm.holders() if s != seq} == others
                changes.register(seq, full, len(full))
                rows[seq] = (start, len(full), full)
            elif kind == "preempt" and live and not admitted:
                seq = live[pick % len(live)]
                bm.free(seq)
                del self.tokens[seq]
                preempted = True
        # the runner: copy-on-write copies, then every row's K/V
        for src, dst in changes.take_copies():
            self.slots[dst] = list(self.slots[src])
        for seq, (start, end, tokens) in rows.items():
            table = bm.table(seq)
            for pos in range(start, end):
                value = GARBAGE if outcome == "rollback" else tokens[pos]
                self.slots[table[pos // BLOCK]][pos % BLOCK] = value
        if outcome == "rollback":
            assert sorted(changes.rollback()) == sorted(admitted)
            assert not changes.is_open
            for seq in self.tokens:
                assert list(bm.table(seq)) == before[seq], "a rollback left a table changed"
            assert not any(bm.holds(s) for s in admitted)
            return
        failed = {s for i, s in enumerate(sorted(rows)) if outcome == "partial" and mask >> i & 1}
        undone = set(changes.rollback(failed))
        assert failed & set(admitted) <= undone <= set(admitted), "only admissions are undone"
        for seq in failed - set(admitted):
            assert list(bm.table(seq)) == before[seq], "a failed row kept its changes"
        dropped = failed | undone  # undone beyond the failed: admitted on their fresh prefix
        assert not any(bm.holds(s) for s in undone)
        if dropped & rows.keys():
            with pytest.raises(ValueError, match="rolled back"):
                changes.commit({s: rows[s][:2] for s in dropped & rows.keys()})
        changes.commit({s: (start, end) for s, (start, end, _) in rows.items() if s not in dropped})
        assert not changes.is_open
        for seq in failed:  # the engine ends a failed row's request
            bm.free(seq)
            self.tokens.pop(seq, None)
        for seq, (_, _, tokens) in rows.items():
            if seq not in dropped:
                self.tokens[seq] = tokens
                self.probes.append(tokens)

    @precondition(_has_sequences)
    @rule(pick=st.integers(0, 1 << 16))
    def fork(self, pick: int) -> None:
        parent = sorted(self.tokens)[pick % len(self.tokens)]
        child = self._new_id()
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    @precondition(_has_sequences)
    @rule(pick=st.integers(0, 1 << 16))
    def free(self, pick: int) -> None:
        seq = sorted(self.tokens)[pick % len(self.tokens)]
        self.bm.free(seq)
        del self.tokens[seq]

    @precondition(_has_sequences)
    @rule(pick=st.integers(0, 1 << 16), twice=st.booleans())
    def leak_then_reclaim(self, pick: int, twice: bool) -> None:
        """Forget a sequence without freeing it; reclaim must take its blocks back and leave
        every live sequence alone."""
        seq = sorted(self.tokens)[pick % len(self.tokens)]
        del self.tokens[seq]
        live_tables = {s: list(self.bm.table(s)) for s in self.tokens}
        result = self.bm.reclaim(self.tokens.keys())
        assert not self.bm.holds(seq)
        assert {s: list(self.bm.table(s)) for s in self.tokens} == live_tables
        assert result.freed >= 0 and result.evicted >= 0
        if twice:
            assert self.bm.reclaim(self.tokens.keys()).freed == 0, "a second sweep finds nothing"

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        bm.check_integrity()
        assert bm.num_free + bm.num_used + bm.num_cached == bm.num_blocks
        states = [bm.state_of(b) for b in range(bm.num_blocks)]
        assert states.count(BlockState.USED) == bm.num_used
        assert sorted(bm.holders()) == sorted(self.tokens), "a live sequence lost its blocks"
        for seq, tokens in self.tokens.items():
            assert bm.stored_tokens(seq) == len(tokens)
            assert all(bm.ref_count(b) >= 1 for b in bm.table(seq))
        assert bm.live_tokens <= sum(len(t) for t in self.tokens.values())

    @invariant()
    def every_sequence_reads_back_its_tokens(self) -> None:
        if not hasattr(self, "bm"):
            return
        for seq_id, tokens in self.tokens.items():
            table = self.bm.table(seq_id)
            stored = [self.slots[table[p // BLOCK]][p % BLOCK] for p in range(len(tokens))]
            assert stored == tokens, f"{seq_id} reads {stored}, wrote {tokens}"

    @invariant()
    def every_cached_prefix_holds_its_tokens(self) -> None:
        if not hasattr(self, "bm"):
            return
        for probe in self.probes[-20:]:
            for j, block in enumerate(self.bm.match_prefix(probe)):
                assert self.slots[block] == probe[j * BLOCK : (j + 1) * BLOCK], (
                    "the prefix cache offers a block whose K/V was never stored"
                )


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=200, stateful_step_count=30)


def _prefill(bm: BlockManager, seq_id: str, tokens: list[int], hits=None) -> int:
    """One committed step admitting ``seq_id`` and storing its tokens."""
    changes = bm.begin_step()
    cached = changes.allocate(seq_id, tokens, len(tokens), hits)
    changes.register(seq_id, tokens, len(tokens))
    changes.commit({seq_id: (cached, len(tokens))})
    return cached


def test_prefix_blocks_are_shared_and_counted_once():
    bm = BlockManager(16, BLOCK, memory_reserve=0.0)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    _prefill(bm, "a", prompt)
    hits = bm.match_prefix(prompt)
    assert hits == list(bm.table("a"))[:2]
    assert _prefill(bm, "b", prompt, hits) == 8
    assert [bm.ref_count(b) for b in hits] == [2, 2]
    assert bm.num_used == 4  # two shared full blocks, one partial block each
    bm.free("a")
    bm.free("b")
    assert bm.num_cached == 2 and bm.num_used == 0
    assert bm.match_prefix(prompt) == hits, "freed prefix blocks stay reusable"


def test_reserve_guard_evicts_cached_blocks_oldest_first():
    bm = BlockManager(10, BLOCK, memory_reserve=0.5)
    for name, first in (("old", 1), ("new", 2)):
        _prefill(bm, name, [first] * 9)
        bm.free(name)
    assert bm.num_cached == 4 and bm.num_free == 6
    assert bm.evict_to_reserve() == 0, "free blocks already cover the reserve"
    _prefill(bm, "x", [9] * 8)
    assert bm.num_free == 4
    assert bm.evict_to_reserve() == 1
    assert len(bm.match_prefix([2] * 9)) == 2, "the newer prefix is untouched"
    assert len(bm.match_prefix([1] * 9)) == 1, "the oldest prefix loses its tail block first"


def test_a_rolled_back_step_unpublishes_its_prefix_and_restores_copies():
    bm = BlockManager(12, BLOCK, memory_reserve=0.0)
    _prefill(bm, "a", [1, 2, 3, 4, 5, 6])
    bm.fork("a", "b")
    before = bm.stats()
    changes = bm.begin_step()
    assert changes.grow("b", 6, 9)  # writes into the shared partial block: copy-on-write
    changes.register("b", [1, 2, 3, 4, 5, 6, 7, 8, 9], 9)
    copies = changes.take_copies()
    assert copies == [(bm.table("a")[1], bm.table("b")[1])]
    with pytest.raises(RuntimeError, match="between steps"):
        bm.reclaim([])
    assert changes.rollback() == []
    assert list(bm.table("b")) == list(bm.table("a")), "b shares a's blocks again"
    assert bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9, 0]) == [bm.table("a")[0]]
    assert bm.stats() == before
    bm.check_integrity()
    with pytest.raises(RuntimeError, match="settled"):
        changes.commit({})


def test_reclaim_frees_what_a_dropped_sequence_held():
    bm = BlockManager(8, BLOCK, memory_reserve=0.0)
    _prefill(bm, "a", [1, 2, 3])
    result = bm.reclaim([])
    assert result.freed == 1 and not bm.holds("a")
    bm.check_integrity()


@pytest.mark.parametrize("block_size", [16, 32, 64])
@given(lengths=st.lists(st.integers(1, 200), min_size=1, max_size=6))
def test_utilization_counts_stored_tokens_over_held_slots(block_size: int, lengths: list[int]):
    bm = BlockManager(6 * -(-200 // 16), block_size, memory_reserve=0.0)  # room for any draw
    for i, n in enumerate(lengths):
        _prefill(bm, f"s{i}", list(range(i * 1000, i * 1000 + n)))
    stats = bm.stats()
    assert stats.live_tokens == sum(lengths)
    assert stats.held_slots == sum(-(-n // block_size) for n in lengths) * block_size
    assert stats.utilization == pytest.approx(stats.live_tokens / stats.held_slots)


def test_allocating_past_the_pool_is_refused_and_changes_nothing():
    bm = BlockManager(4, 16, memory_reserve=0.0)
    _prefill(bm, "a", list(range(40)))
    before = bm.stats()
    changes = bm.begin_step()
    with pytest.raises(ValueError, match="needs 2 blocks, 1 are not in use"):
        changes.allocate("b", list(range(100, 120)), 20)
    changes.commit({})
    assert bm.stats() == before and not bm.holds("b")
    bm.check_integrity()


def test_the_table_view_is_read_only_and_live():
    bm = BlockManager(8, BLOCK, memory_reserve=0.0)
    _prefill(bm, "a", [1, 2, 3])
    view = bm.table("a")
    with pytest.raises(TypeError):
        view[0] = 5  # type: ignore[index]
    changes = bm.begin_step()
    changes.grow("a", 3, 9)
    changes.commit({"a": (3, 9)})
    assert len(view) == 3 and view[:3] == list(bm.table("a")), "the view follows the table"


def test_rolling_back_a_row_rolls_back_the_admissions_on_its_fresh_prefix():
    bm = BlockManager(8, BLOCK, memory_reserve=0.0)
    changes = bm.begin_step()
    changes.allocate("a", [0] * 4, 4)
    changes.register("a", [0] * 4, 4)
    hits = bm.match_prefix([0] * 5)
    assert hits == list(bm.table("a")), "a later admission shares the fresh block at once"
    assert changes.allocate("b", [0] * 5, 5, hits) == 4
    changes.allocate("c", [1] * 5, 5)
    assert sorted(changes.rollback(["a"])) == ["a", "b"], "b read K/V only a vouched for"
    changes.commit({"c": (0, 5)})
    assert bm.holders() == ["c"] and bm.match_prefix([0] * 5) == []
    bm.check_integrity()
