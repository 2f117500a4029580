"""The router's count of requests in flight per replica (control/fleet/inflight.py), in the
orders Ray reports them. No Ray needed."""

from __future__ import annotations

import pytest

from control.fleet import inflight
from control.fleet.inflight import InFlight


def test_a_request_counts_from_its_choice_to_its_end() -> None:
    counts = InFlight()
    assert counts.retry("q1") == 0
    counts.chosen("q1", "a", 1)
    assert counts.counts() == {"a": 1}  # before Ray sends it: a burst sees it
    counts.routed("q1", "a")
    assert counts.counts() == {"a": 1}
    counts.completed("q1", "a")
    assert counts.counts() == {"a": 0}


def test_an_end_reported_before_the_routing_does_not_leave_a_count_behind() -> None:
    """Ray registers the completion callback before it reports the request routed: a short
    request can end in between. Counted then, it stayed on its replica for good."""
    counts = InFlight()
    counts.chosen("q1", "a", 1)
    counts.completed("q1", "a")
    counts.routed("q1", "a")
    assert counts.counts() == {}
    counts.chosen("q2", "a", 1)  # the next one on the same replica counts as usual
    counts.routed("q2", "a")
    assert counts.counts() == {"a": 1}


def test_a_retry_moves_the_count_and_forgets_the_refused_sends_end() -> None:
    counts = InFlight()
    counts.chosen("q1", "a", 1)
    counts.completed("q1", "a")  # "a" refused it (queue full): that send ended
    assert counts.retry("q1") == 1
    counts.chosen("q1", "b", 2)
    assert counts.counts() == {"b": 1}
    counts.routed("q1", "b")
    assert counts.counts() == {"b": 1}  # counted: the end seen was the refused send's
    counts.completed("q1", "b")
    assert counts.counts() == {"b": 0}


def test_a_choice_never_sent_stops_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = InFlight()
    counts.chosen("q1", "a", 1)
    monkeypatch.setattr(inflight, "PROVISIONAL_S", -1.0)  # its time is up
    assert counts.counts() == {}


def test_replicas_that_left_are_dropped_and_old_ends_are_bounded() -> None:
    counts = InFlight()
    for request, replica in (("q1", "a"), ("q2", "b")):
        counts.chosen(request, replica, 1)
        counts.routed(request, replica)
    counts.keep_only({"b"})
    assert counts.counts() == {"b": 1}
    for n in range(inflight.ENDED_KEPT + 10):  # every call's end is reported
        counts.completed(f"other-{n}", "b")
    counts.chosen("other-0", "b", 1)  # the oldest ends were forgotten: it counts
    counts.routed("other-0", "b")
    assert counts.counts() == {"b": 2}
