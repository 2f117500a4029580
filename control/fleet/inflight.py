"""The router's count of ``generate`` requests in flight per replica (plain Python, no Ray).

A request counts on its replica from the moment the router chooses it (provisionally, so the
other routing tasks of a burst see it before Ray sends it), then from Ray's ``routed`` report
until its ``completed`` one. Ray registers a request's completion callback before it reports
the request routed: a short request can end first. Its late ``routed`` report must not count it
again, or the replica keeps a request that ended for good, and power of two choices avoids
that replica from then on. Ends seen before their start are remembered (the newest
``ENDED_KEPT``) for that.

A replica that refuses a send (its queue is full) ends that send, and Ray asks again: the next
choice forgets that end. Should the refused send's end come after it, the request goes
uncounted while it runs, which corrects itself when it ends (a count never leaks upward).

Ray's router loop changes these records while the control plane's threads read ``counts``
(``/admin/state``): every walk copies first.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from typing import NamedTuple

PROVISIONAL_S = 5.0
"""How long a request chosen for a replica counts there before Ray reports it sent."""
ENDED_KEPT = 4096
"""Ends of requests not counted yet (any call's: Ray reports every call's end) kept."""


class Provisional(NamedTuple):
    """A ``generate`` call chosen for a replica and not yet sent there."""

    replica: str
    at: float
    tries: int
    """How many times Ray asked where to send it (a failed queue probe asks again)."""


class InFlight:
    def __init__(self) -> None:
        self._sent: dict[str, set[str]] = defaultdict(set)
        self._provisional: dict[str, Provisional] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    def retry(self, request: str) -> int:
        """Ray asks where to send ``request`` (again, after a replica refused it: its earlier
        choice stops counting, and the end reported for the refused send is not its end).
        Returns how many times it was chosen before."""
        self._ended.pop(request, None)
        before = self._provisional.pop(request, None)
        return before.tries if before else 0

    def chosen(self, request: str, replica: str, tries: int) -> None:
        self._provisional[request] = Provisional(replica, time.monotonic(), tries)

    def routed(self, request: str, replica: str) -> None:
        self._provisional.pop(request, None)
        if request in self._ended:  # it ended already: its completion came first
            del self._ended[request]
            return
        self._sent[replica].add(request)

    def completed(self, request: str, replica: str) -> None:
        sent = self._sent.get(replica)
        if sent is not None and request in sent:
            sent.discard(request)
            return
        self._ended[request] = None
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def keep_only(self, live: set[str]) -> None:
        """Forget the replicas that left (their requests ended with them)."""
        for gone in set(self._sent) - live:
            self._sent.pop(gone, None)

    def counts(self) -> dict[str, int]:
        counts = {rid: len(ids) for rid, ids in list(self._sent.items())}
        now = time.monotonic()
        for request, (rid, at, _) in list(self._provisional.items()):
            if now - at > PROVISIONAL_S:  # never sent (cancelled while routing)
                self._provisional.pop(request, None)
            else:
                counts[rid] = counts.get(rid, 0) + 1
        return counts
