"""The router's memory of where it sent each prompt prefix (control/fleet/affinity.py): what it
answers for a replica whose cache probe was late. No Ray needed."""

from __future__ import annotations

from control.fleet.affinity import PrefixAffinity, merged, prefix_hashes
from control.fleet.score import ReplicaLoad, RouteHint, rank

BLOCK = 16


def prompt(start: int, blocks: int, tail: int = 1) -> list[int]:
    return [*range(start, start + blocks * BLOCK), tail]


def test_hashes_cover_the_full_blocks_before_the_last_token_and_chain() -> None:
    assert len(prefix_hashes(prompt(0, 6), BLOCK)) == 6
    assert len(prefix_hashes(list(range(6 * BLOCK)), BLOCK)) == 5  # the last block holds the end
    assert prefix_hashes(list(range(BLOCK)), BLOCK) == ()
    a, b = prefix_hashes(prompt(0, 3), BLOCK), prefix_hashes(prompt(0, 3, tail=9), BLOCK)
    assert a == b  # the tail is not a full block
    changed = [0, *range(1, 3 * BLOCK), 1]
    changed[0] = 99  # the first block differs: every later hash differs (a chain)
    assert not set(prefix_hashes(changed, BLOCK)) & set(a)


def test_a_prefix_is_remembered_on_the_replica_it_was_sent_to() -> None:
    memory = PrefixAffinity()
    memory.record(prefix_hashes(prompt(0, 6), BLOCK), "r1")
    memory.record(prefix_hashes(prompt(500, 6), BLOCK), "r2")
    assert memory.hits(prefix_hashes(prompt(0, 6, tail=7), BLOCK)) == {"r1": 6}
    longer = [*range(0, 4 * BLOCK), *range(900, 900 + 4 * BLOCK), 1]  # shares 4 blocks
    assert memory.hits(prefix_hashes(longer, BLOCK)) == {"r1": 4}
    assert memory.hits(prefix_hashes(prompt(2000, 6), BLOCK)) == {}


def test_two_replicas_holding_a_prefix_each_count_their_own_depth() -> None:
    memory = PrefixAffinity()
    memory.record(prefix_hashes(prompt(0, 2), BLOCK), "r1")
    memory.record(prefix_hashes(prompt(0, 5), BLOCK), "r2")
    assert memory.hits(prefix_hashes(prompt(0, 5), BLOCK)) == {"r1": 2, "r2": 5}


def test_the_oldest_blocks_are_forgotten_past_the_capacity() -> None:
    memory = PrefixAffinity(capacity=8)
    old, new = prefix_hashes(prompt(0, 6), BLOCK), prefix_hashes(prompt(500, 6), BLOCK)
    memory.record(old, "r1")
    memory.record(new, "r2")
    assert len(memory) == 8
    assert memory.hits(old) == {}  # its first blocks went first: nothing leads to the rest
    assert memory.hits(new) == {"r2": 6}
    memory.record(old[:2], "r1")  # sent again: the newest now
    assert memory.hits(old) == {"r1": 2}


def test_a_replica_that_left_is_forgotten() -> None:
    memory = PrefixAffinity()
    hashes = prefix_hashes(prompt(0, 6), BLOCK)
    memory.record(hashes, "r1")
    memory.record(hashes, "r2")
    memory.keep_only({"r2", "r3"})
    assert memory.hits(hashes) == {"r2": 6}
    memory.keep_only({"r3"})
    assert memory.hits(hashes) == {} and len(memory) == 0


def test_the_memory_stands_in_only_for_a_replica_whose_probe_did_not_answer() -> None:
    assert merged({"r1": 0}, {"r1": 6, "r2": 3}) == {"r1": 0, "r2": 3}
    loads = {"r1": ReplicaLoad(0, 0, 100), "r2": ReplicaLoad(0, 0, 100)}
    memory = PrefixAffinity()
    hashes = prefix_hashes(prompt(0, 6), BLOCK)
    memory.record(hashes, "r2")
    for probed in ({}, {"r1": 0}):  # r2 late (or both): the memory sends it to r2
        hint = RouteHint(6, merged(probed, memory.hits(hashes)), hashes)
        assert rank(["r1", "r2"], loads, {}, hint) == [["r2"]]
    evicted = RouteHint(6, merged({"r1": 6, "r2": 0}, memory.hits(hashes)), hashes)
    assert rank(["r1", "r2"], loads, {}, evicted) == [["r1"]]  # the probe's answer wins


def test_a_replica_without_stats_is_scored_by_its_requests_in_flight() -> None:
    """A hint is not dropped because one replica (just started) has no routing stats yet."""
    loads = {"r1": ReplicaLoad(0, 0, 100), "r2": None}
    assert rank(["r1", "r2"], loads, {}, RouteHint(6, {"r2": 6})) == [["r2"]]
    assert rank(["r1", "r2"], loads, {"r2": 3}, RouteHint(6, {"r2": 6})) == [["r1"]]
