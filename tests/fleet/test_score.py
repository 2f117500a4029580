"""The router's score (control/fleet/score.py) and the autoscaling options: no Ray needed."""

from __future__ import annotations

import random

from control.fleet.score import FALLBACK_AFTER, PREFIX_WEIGHT, ReplicaLoad, RouteHint, rank, score


def test_a_cached_prefix_wins_while_queues_are_balanced() -> None:
    loads = {"a": ReplicaLoad(0, 1, 100), "b": ReplicaLoad(0, 1, 100)}
    for _ in range(20):
        assert rank(["a", "b"], loads, {}, RouteHint(6, {"b": 6}))[0] == ["b"]


def test_a_busier_replica_loses_its_prefix_advantage() -> None:
    busy = int(PREFIX_WEIGHT) + 1
    loads = {"a": ReplicaLoad(0, 0, 100), "b": ReplicaLoad(busy, 0, 100)}
    assert rank(["a", "b"], loads, {}, RouteHint(6, {"b": 6}))[0] == ["a"]
    assert score(loads["b"], None, 6, 6) == busy - PREFIX_WEIGHT  # stats: none routed yet
    assert score(loads["b"], 0, 6, 6) == -PREFIX_WEIGHT  # routed ones ended: the stats lag


def test_requests_in_flight_count_when_the_stats_are_behind() -> None:
    loads = {"a": ReplicaLoad(0, 0, 100), "b": ReplicaLoad(0, 0, 100)}
    assert rank(["a", "b"], loads, {"a": 3}, RouteHint(2, {}))[0] == ["b"]


def test_a_replica_without_room_for_the_prompt_goes_last() -> None:
    loads = {"a": ReplicaLoad(0, 0, 2), "b": ReplicaLoad(5, 0, 100)}
    assert rank(["a", "b"], loads, {}, RouteHint(8, {})) == [["b"]]


def test_the_others_are_offered_only_after_the_chosen_one_failed_its_tries() -> None:
    """Offered at once, the second rank took a request whenever a queue probe timed out, while
    the in-flight count had it on the first: two simultaneous requests could share one."""
    loads = {"a": ReplicaLoad(0, 0, 100), "b": ReplicaLoad(0, 0, 100), "c": None}
    hint = RouteHint(4, {"b": 4})
    for attempt in range(FALLBACK_AFTER):
        assert rank(["a", "b"], loads, {}, hint, attempt=attempt) == [["b"]]
    assert rank(["a", "b"], loads, {}, hint, attempt=FALLBACK_AFTER) == [["b"], ["a"]]
    first, *rest = rank(["a", "b", "c"], loads, {"a": 1}, None, attempt=FALLBACK_AFTER)
    assert len(first) == 1 and sorted(first + rest[0]) == ["a", "b", "c"]


def test_power_of_two_choices_without_a_hint() -> None:
    """Two at random, the one with fewer requests in flight from here (decided here, not by
    Ray's queue probe, which a burst outruns); stats or none."""
    rng = random.Random(0)
    loads = {"a": None, "b": ReplicaLoad(), "c": ReplicaLoad()}
    chosen = {rank(["a", "b", "c"], loads, {"a": 5}, None, rng)[0][0] for _ in range(40)}
    assert chosen == {"b", "c"}  # "a" loses every pair it is drawn in
    full = {"a": ReplicaLoad(), "b": ReplicaLoad()}
    assert rank(["a", "b"], full, {"b": 1}, None, rng) == [["a"]]
    assert {rank(["a", "b"], full, {}, None, rng)[0][0] for _ in range(40)} == {"a", "b"}


def test_autoscaling_by_ongoing_requests_only_with_a_ceiling() -> None:
    from control.core.config import Settings
    from control.fleet.fleet import scaling

    assert scaling(Settings(replicas=3)) == {"num_replicas": 3}
    config = scaling(
        Settings(replicas=2, min_replicas=1, max_replicas=6, target_ongoing_requests=4)
    )
    assert config == {
        "autoscaling_config": {
            "min_replicas": 1,
            "initial_replicas": 2,
            "max_replicas": 6,
            "target_ongoing_requests": 4.0,
        }
    }


def test_the_best_score_alone_first_and_equal_scores_at_random() -> None:
    loads = {"a": ReplicaLoad(0, 1, 100), "b": ReplicaLoad(0, 0, 100)}
    assert rank(["a", "b"], loads, {}, RouteHint(4, {"a": 1})) == [["b"]]  # 0.5 vs 0
    firsts = {rank(["a", "b"], loads, {"a": 2, "b": 2}, RouteHint(4, {}))[0][0] for _ in range(40)}
    assert firsts == {"a", "b"}
