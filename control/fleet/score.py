"""The request router's score, in plain Python (no Ray): what ``router.FleetRouter`` ranks by.

For a request to replica ``r`` (lower is better)::

    score(r) = queue(r) - PREFIX_WEIGHT * hit_blocks(r) / prompt_blocks

``queue`` is the requests this control plane routed to the replica and has not seen end
(exact: every request reaches the replicas through it, and one chosen for a single replica
counts there at once), or, for a replica it has not routed to yet, ``waiting + running`` from
the replica's routing stats (up to ``ROUTING_STATS_PERIOD_S`` old plus Ray's propagation, which
a burst outruns). ``hit_blocks`` is the replica's longest cached prefix for this prompt
(``BlockManager.match_prefix``, asked just before routing when prefix caching is on; for a
replica that did not answer in time, the router's memory of the prefixes it sent there,
``affinity.py``); a full hit is worth ``PREFIX_WEIGHT`` queued requests, so a cached prefix
wins while queues are balanced and loses once its replica is that much busier. A replica whose
free KV blocks above the reserve cannot hold the prompt's uncached blocks would queue it: it is
ranked after every replica that can; one without routing stats yet (just started) is scored by
its requests in flight from here. The best score gets the request (equal scores: one at
random). Requests without a prompt hint (prefix caching off, a prompt under one block) fall
back to power-of-two choices, decided here: two at random, the one with fewer requests in
flight from this control plane (exact, and counted at once, so a burst's routing tasks do not
all pick the replica whose queue Ray last probed as empty).

Ray Serve is given the chosen replica alone (it still probes that replica's queue) until
``FALLBACK_AFTER`` tries of one request failed (a probe timed out on a loaded machine, a full
queue); then the others form a second rank. Offered at once, that second rank took requests
whenever a probe timed out, while the in-flight count had them on the first: under load two
simultaneous requests could land on one replica.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

PREFIX_WEIGHT = 2.0
"""A whole prompt found in a replica's prefix cache is worth this many queued requests."""
ROUTING_STATS_PERIOD_S = 0.5
"""How often Ray Serve asks each replica for its routing stats."""
FALLBACK_AFTER = 3
"""Tries of one request on its chosen replica before the other replicas are offered too."""


class Draws(Protocol):
    """What the ranking draws with: a seeded ``random.Random``, or the ``random`` module
    itself (its shared generator)."""

    def random(self) -> float: ...

    def sample(self, population: Sequence[str], k: int) -> list[str]: ...

    def shuffle(self, x: list[str]) -> None: ...


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's routing inputs (its ``record_routing_stats``), as ``/admin/state`` shows."""

    waiting: int = 0
    running: int = 0
    free_blocks: int = 0
    """Free or cached blocks above the reserve: what admission may still take."""
    version: int | None = None

    @property
    def queue(self) -> int:
        return self.waiting + self.running

    @classmethod
    def of(cls, stats: Mapping[str, object] | None) -> ReplicaLoad | None:
        if not stats:
            return None
        given = {
            k: stats[k] for k in ("waiting", "running", "free_blocks", "version") if k in stats
        }
        # Ray hands the routing stats (the replica's record_routing_stats) over as a plain dict
        return cls(**given)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RouteHint:
    """What the client learnt about one request before routing it."""

    prompt_blocks: int
    hits: Mapping[str, int]
    """Cached prefix blocks per replica id (absent: unknown, counted as 0)."""
    blocks: tuple[int, ...] = ()
    """The prompt's prefix block hashes (``affinity.prefix_hashes``): what the router
    remembers where it sent, and looks up for a replica whose probe did not answer."""


def score(load: ReplicaLoad, in_flight: int | None, hits: int, prompt_blocks: int) -> float:
    queue = load.queue if in_flight is None else in_flight
    return queue - PREFIX_WEIGHT * hits / max(prompt_blocks, 1)


def rank(
    replicas: Sequence[str],
    loads: Mapping[str, ReplicaLoad | None],
    in_flight: Mapping[str, int],
    hint: RouteHint | None,
    rng: Draws | None = None,
    attempt: int = 0,
) -> list[list[str]]:
    """Replica ids in ranks, the chosen one first alone; the rest as a second rank from the
    ``FALLBACK_AFTER``-th try of the same request on (``attempt`` counts from 0)."""
    draws: Draws = random if rng is None else rng
    if not replicas:
        return []
    if hint is None:
        ranked = two_choices(replicas, in_flight, draws)
    else:
        scored = []
        for r in replicas:
            load, hits = loads.get(r), hint.hits.get(r, 0)
            if load is None:  # no stats yet: its queue is what was routed there from here
                fits, load = True, ReplicaLoad()
                cost = score(load, in_flight.get(r, 0), hits, hint.prompt_blocks)
            else:
                fits = load.free_blocks >= hint.prompt_blocks - hits
                cost = score(load, in_flight.get(r), hits, hint.prompt_blocks)
            scored.append((not fits, cost, r))
        scored.sort(key=lambda item: (item[0], item[1], draws.random()))  # equal scores: at random
        ranked = [r for _, _, r in scored]
    rest = [r for r in replicas if r != ranked[0]]
    return [ranked[:1], rest] if rest and attempt >= FALLBACK_AFTER else [ranked[:1]]


def two_choices(replicas: Sequence[str], in_flight: Mapping[str, int], rng: Draws) -> list[str]:
    """Power of two choices: two replicas at random, the one with fewer in flight first
    (equal counts: either)."""
    picked = list(replicas) if len(replicas) <= 2 else rng.sample(list(replicas), 2)
    rng.shuffle(picked)
    return sorted(picked, key=lambda r: in_flight.get(r, 0))
