"""The request router's score, in plain Python (no Ray): what ``router.FleetRouter`` ranks by.

For a request to replica ``r`` (lower is better)::

    score(r) = queue(r) - PREFIX_WEIGHT * hit_blocks(r) / prompt_blocks

``queue`` is the requests this control plane routed to the replica and has not seen end
(exact: every request reaches the replicas through it, and one chosen for a single replica
counts there at once), or, for a replica it has not routed to yet, ``waiting + running`` from
the replica's routing stats (up to ``ROUTING_STATS_PERIOD_S`` old plus Ray's propagation, which
a burst outruns). ``hit_blocks`` is the replica's longest cached prefix for this prompt
(``BlockManager.match_prefix``, asked just before routing when prefix caching is on); a full
hit is worth ``PREFIX_WEIGHT`` queued requests, so a cached prefix wins while queues are
balanced and loses once its replica is that much busier. A replica whose free KV blocks above
the reserve cannot hold the prompt's uncached blocks would queue it: it is ranked after every
replica that can. The best score gets the request (equal scores: one at random), the others
form the next rank, which Ray Serve tries when the first replica's queue is full. Replicas
without stats yet and requests without a prompt hint fall back to power-of-two choices (two at
random; Ray Serve probes both queues and takes the shorter).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREFIX_WEIGHT = 2.0
"""A whole prompt found in a replica's prefix cache is worth this many queued requests."""
ROUTING_STATS_PERIOD_S = 0.5
"""How often Ray Serve asks each replica for its routing stats."""


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
        return cls(
            **{k: stats[k] for k in ("waiting", "running", "free_blocks", "version") if k in stats}
        )  # type: ignore[arg-type]


@dataclass(frozen=True)
class RouteHint:
    """What the client learnt about one request before routing it."""

    prompt_blocks: int
    hits: Mapping[str, int]
    """Cached prefix blocks per replica id (absent: unknown, counted as 0)."""


def score(load: ReplicaLoad, in_flight: int | None, hits: int, prompt_blocks: int) -> float:
    queue = load.queue if in_flight is None else in_flight
    return queue - PREFIX_WEIGHT * hits / max(prompt_blocks, 1)


def rank(
    replicas: Sequence[str],
    loads: Mapping[str, ReplicaLoad | None],
    in_flight: Mapping[str, int],
    hint: RouteHint | None,
    rng: random.Random | None = None,
) -> list[list[str]]:
    """Replica ids in ranks, the best first (Ray tries a rank's members by queue length)."""
    rng = rng or random
    if not replicas:
        return []
    known = [r for r in replicas if loads.get(r) is not None]
    if hint is None or len(known) < len(replicas):
        return [two_choices(replicas, in_flight, rng)]
    scored = []
    for r in replicas:
        load = loads[r]
        assert load is not None
        hits = hint.hits.get(r, 0)
        fits = load.free_blocks >= hint.prompt_blocks - hits
        scored.append((not fits, score(load, in_flight.get(r), hits, hint.prompt_blocks), r))
    scored.sort(key=lambda item: (item[0], item[1], rng.random()))  # equal scores: at random
    ranked = [r for _, _, r in scored]
    return [ranked[:1], ranked[1:]] if len(ranked) > 1 else [ranked]


def two_choices(
    replicas: Sequence[str], in_flight: Mapping[str, int], rng: random.Random | random.Random
) -> list[str]:
    """Power of two choices: two replicas at random, the one with fewer in flight first."""
    if len(replicas) <= 2:
        picked = list(replicas)
        rng.shuffle(picked)
    else:
        picked = rng.sample(list(replicas), 2)
    return sorted(picked, key=lambda r: in_flight.get(r, 0))
