"""Figures per tenant and per priority class: who got how much service, and how long each
waited. The simulator's records, the bench's measured requests and the dry run's prediction
are all summarised by these functions, so measured and predicted read alike.

A tenant's service is VTC's weighted count (engine/tenants.py ``ServiceCost``: input and
output token weights); its share is that over every tenant's, beside its weight's share.
Groups are bounded: the ``limit`` largest by service, the rest summed as ``other``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from engine.stats import percentile
from engine.tenants import OTHER_TENANT, ServiceCost

GROUP_LIMIT = 16
"""Most groups a summary lists by name (the rest are summed as ``other``)."""


class Served(Protocol):
    """One finished request, as far as the groups need it."""

    @property
    def tenant(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def ttft(self) -> float | None: ...
    @property
    def tpot(self) -> float | None: ...


class GroupFigures(BaseModel):
    """One tenant's or one priority class's requests: service and latency percentiles."""

    model_config = ConfigDict(frozen=True)
    key: str = Field(description="The tenant's name, or the priority class (its integer).")
    requests: int
    input_tokens: int
    output_tokens: int
    service: float = Field(description="Weighted service: input and output tokens by weight.")
    share: float = Field(description="Its service over every group's (0..1).")
    weight_share: float | None = Field(
        None, description="Its weight over the weights of the tenants listed (tenants only)."
    )
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None


def _figures(
    key: str,
    records: list[Served],
    cost: ServiceCost,
    total: float,
    weight_share: float | None = None,
) -> GroupFigures:
    inputs = sum(r.prompt_tokens for r in records)
    outputs = sum(r.output_tokens for r in records)
    service = cost.input_weight * inputs + cost.output_weight * outputs
    ttfts = [r.ttft for r in records if r.ttft is not None]
    tpots = [r.tpot for r in records if r.tpot is not None]
    return GroupFigures(
        key=key,
        requests=len(records),
        input_tokens=inputs,
        output_tokens=outputs,
        service=service,
        share=service / total if total > 0 else 0.0,
        weight_share=weight_share,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p99_s=percentile(tpots, 99),
    )


def _grouped(
    records: Iterable[Served], key: Callable[[Served], str], cost: ServiceCost, limit: int
) -> tuple[list[tuple[str, list[Served]]], float]:
    groups: dict[str, list[Served]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)

    def service(rs: list[Served]) -> float:
        return sum(
            cost.input_weight * r.prompt_tokens + cost.output_weight * r.output_tokens for r in rs
        )

    ranked = sorted(groups.items(), key=lambda kv: (-service(kv[1]), kv[0]))
    named, rest = ranked[:limit], ranked[limit:]
    if rest:
        named.append((OTHER_TENANT, [r for _, rs in rest for r in rs]))
    return named, sum(service(rs) for _, rs in named)


def by_tenant(
    records: Iterable[Served], cost: ServiceCost | None = None, limit: int = GROUP_LIMIT
) -> list[GroupFigures]:
    """Per tenant, the most served first; ``weight_share`` from ``cost``'s weights."""
    cost = cost or ServiceCost()
    named, total = _grouped(records, lambda r: r.tenant, cost, limit)
    weights = {name: cost.weight(name) for name, _ in named}
    weight_total = sum(weights.values())
    return [
        _figures(name, rs, cost, total, weights[name] / weight_total if weight_total else None)
        for name, rs in named
    ]


def by_priority(
    records: Iterable[Served], cost: ServiceCost | None = None, limit: int = GROUP_LIMIT
) -> list[GroupFigures]:
    """Per priority class, the most urgent (lowest value) first."""
    cost = cost or ServiceCost()
    named, total = _grouped(records, lambda r: str(r.priority), cost, limit)
    named.sort(key=lambda kv: (kv[0] == OTHER_TENANT, int(kv[0]) if kv[0] != OTHER_TENANT else 0))
    return [_figures(key, rs, cost, total) for key, rs in named]
