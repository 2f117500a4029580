"""Figures per tenant and per priority class (sim/groups.py): shares sum to one and follow
the token weights, weight shares follow the queue's weights, the groups are bounded (the rest
summed as ``other``), and the simulator's per-tenant figures show the fair queue at work."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.tenants import OTHER_TENANT, ServiceCost
from policies.queue import FairQueue, FcfsQueue
from sim.groups import by_priority, by_tenant
from sim.models import load_cost_model
from sim.simulator import SimSetup, simulate
from sim.trace import TraceRequest


@dataclass(frozen=True)
class Done:
    tenant: str
    priority: int
    prompt_tokens: int
    output_tokens: int
    ttft: float | None
    tpot: float | None


def test_shares_follow_the_token_weights_and_weight_shares_the_weights() -> None:
    records = [Done("a", 0, 10, 5, 0.1, 0.01), Done("b", 5, 30, 0, 0.3, None)]
    # a: 1*10 + 2*5 = 20, b: 30 -> 0.4 / 0.6
    groups = {g.key: g for g in by_tenant(records, ServiceCost(weights={"a": 3.0}))}
    assert groups["a"].share == pytest.approx(0.4) and groups["b"].share == pytest.approx(0.6)
    assert groups["a"].weight_share == pytest.approx(0.75)
    assert groups["b"].tpot_p50_s is None and groups["a"].ttft_p99_s == pytest.approx(0.1)
    output_only = {g.key: g.share for g in by_tenant(records, ServiceCost(0.0, 1.0))}
    assert output_only == {"a": 1.0, "b": 0.0}
    assert [g.key for g in by_priority(records)] == ["0", "5"]


def test_groups_are_bounded_the_rest_summed_as_other() -> None:
    records = [Done(f"t{i}", i, 1 + i, 1, 0.1, 0.01) for i in range(40)]
    tenants = by_tenant(records, limit=5)
    assert len(tenants) == 6 and tenants[-1].key == OTHER_TENANT
    assert [g.key for g in tenants[:5]] == ["t39", "t38", "t37", "t36", "t35"]  # most served
    assert sum(g.requests for g in tenants) == 40
    assert sum(g.share for g in tenants) == pytest.approx(1.0)
    priorities = by_priority(records, limit=3)
    assert [g.key for g in priorities] == ["37", "38", "39", OTHER_TENANT]


def test_simulated_fair_queue_serves_the_light_tenant_early() -> None:
    """A's burst first, B's after: first come, first served makes B wait; fair does not."""
    trace = [TraceRequest(0.0, 512, 64, 0, "A") for _ in range(60)]
    trace += [TraceRequest(0.01, 512, 64, 0, "B") for _ in range(10)]
    setup = SimSetup(max_num_seqs=8, num_kv_blocks=2048)
    model = load_cost_model("a100-80g/llama3-8b")

    def b_ttft(queue: FcfsQueue | FairQueue) -> float:
        result = simulate(trace, model, "continuous", setup, queue=queue)
        figures = {g.key: g for g in by_tenant(result.records, queue.cost())}
        assert figures["A"].requests == 60 and figures["B"].requests == 10
        return figures["B"].ttft_p50_s  # type: ignore[return-value]

    assert b_ttft(FairQueue()) < b_ttft(FcfsQueue()) / 2
