"""The router's score (control/fleet/score.py) and the autoscaling options: no Ray needed."""

from __future__ import annotations

import random

from control.fleet.score import PREFIX_WEIGHT, ReplicaLoad, RouteHint, rank, score


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
    assert rank(["a", "b"], loads, {}, RouteHint(8, {})) == [["b"], ["a"]]


def test_power_of_two_choices_without_stats_or_hint() -> None:
    rng = random.Random(0)
    loads = {"a": None, "b": ReplicaLoad(), "c": ReplicaLoad()}
    for _ in range(20):
        (first,) = rank(["a", "b", "c"], loads, {"a": 5}, RouteHint(2, {}), rng)
        assert len(first) == 2 and len(set(first)) == 2
        if "a" in first:
            assert first[-1] == "a"  # the longer queue second
    full = {"a": ReplicaLoad(), "b": ReplicaLoad()}
    assert sorted(rank(["a", "b"], full, {}, None, rng)[0]) == ["a", "b"]


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
    assert rank(["a", "b"], loads, {}, RouteHint(4, {"a": 1})) == [["b"], ["a"]]  # 0.5 vs 0
    firsts = {rank(["a", "b"], loads, {"a": 2, "b": 2}, RouteHint(4, {}))[0][0] for _ in range(40)}
    assert firsts == {"a", "b"}
