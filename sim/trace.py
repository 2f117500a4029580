"""Request traces: when each request arrived and how many tokens it reads and writes.

The CSV uses Vidur's column names (``arrived_at`` in seconds, token counts) plus an optional
``shared_prefix``: how many leading prompt tokens the request shares with every other request
that has one (a common system prompt), so the prefix cache shares only what the trace says,
and optional ``tenant`` and ``priority`` (who sent it, and its priority: lower is served earlier
under the priority queue), written only where some row differs from the default.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
SHARED_PREFIX = "shared_prefix"
TENANT = "tenant"
PRIORITY = "priority"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrived_at: float
    num_prefill_tokens: int
    num_decode_tokens: int
    shared_prefix: int = 0
    tenant: str = DEFAULT_TENANT
    priority: int = DEFAULT_PRIORITY

    def __post_init__(self) -> None:
        if self.arrived_at < 0 or self.num_prefill_tokens < 1 or self.num_decode_tokens < 1:
            raise ValueError(f"not a request: {self}")
        if not 0 <= self.shared_prefix <= self.num_prefill_tokens:
            raise ValueError(f"shared_prefix must be in [0, num_prefill_tokens]: {self}")


def read_trace(path: Path | str) -> list[TraceRequest]:
    """Rows in file order; ``shared_prefix`` is 0 where the column is absent or empty."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing trace columns {sorted(missing)}")
        return [
            TraceRequest(
                float(row["arrived_at"]),
                int(row["num_prefill_tokens"]),
                int(row["num_decode_tokens"]),
                int(row.get(SHARED_PREFIX) or 0),
                row.get(TENANT) or DEFAULT_TENANT,
                int(row.get(PRIORITY) or DEFAULT_PRIORITY),
            )
            for row in reader
        ]


def write_trace(path: Path | str, requests: Iterable[TraceRequest]) -> None:
    requests = list(requests)
    shared = any(r.shared_prefix for r in requests)
    owned = any(r.tenant != DEFAULT_TENANT or r.priority != DEFAULT_PRIORITY for r in requests)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        extra = ((SHARED_PREFIX,) if shared else ()) + ((TENANT, PRIORITY) if owned else ())
        writer.writerow(COLUMNS + extra)
        for r in requests:
            row: list[object] = [repr(r.arrived_at), r.num_prefill_tokens, r.num_decode_tokens]
            row += [r.shared_prefix] if shared else []
            row += [r.tenant, r.priority] if owned else []
            writer.writerow(row)


@dataclass(frozen=True, slots=True)
class Uniform:
    """Token counts drawn uniformly from ``lo..hi`` inclusive."""

    lo: int
    hi: int

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)


def burst_trace(
    n: int, prompt_dist: Uniform, output_dist: Uniform, seed: int
) -> list[TraceRequest]:
    """``n`` requests all arriving at t=0 (the article's "N concurrent")."""
    rng = random.Random(seed)
    return [TraceRequest(0.0, prompt_dist.draw(rng), output_dist.draw(rng)) for _ in range(n)]


def poisson_trace(
    rate: float, n: int, prompt_dist: Uniform, output_dist: Uniform, seed: int
) -> list[TraceRequest]:
    """``n`` requests with exponential gaps of mean ``1 / rate`` seconds, the first at t=0."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(TraceRequest(t, prompt_dist.draw(rng), output_dist.draw(rng)))
        t += rng.expovariate(rate)
    return out


ARTICLE_INPUT = Uniform(500, 2000)
ARTICLE_OUTPUT = Uniform(200, 200)
WORKLOADS = ("article-100", "article-500", "article-10000", "poisson")
"""``servedeck simulate --workload`` names: the article's bursts (input 500-2,000, output
200, all at t=0) and a Poisson stream (``poisson`` or ``poisson-RATE``, 1,000 requests)."""


def workload_trace(name: str, seed: int = 0) -> list[TraceRequest]:
    if name.startswith("article-"):
        return burst_trace(int(name.removeprefix("article-")), ARTICLE_INPUT, ARTICLE_OUTPUT, seed)
    if name == "poisson" or name.startswith("poisson-"):
        rate = float(name.removeprefix("poisson-")) if "-" in name else 5.0
        return poisson_trace(rate, 1000, ARTICLE_INPUT, ARTICLE_OUTPUT, seed)
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)} (or poisson-RATE)")
