"""bench/fairness.py's readings: the service difference is taken over the longest stretch in
which both tenants had requests waiting (max minus min of the difference, so every
sub-interval counts), and a real engine driven with two tenants under ``fair`` records each
tenant's service step by step, as its ledger counts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fairness import backlogged, merged, poisson, queue
from bench.runner import (
    EngineFactory,
    EngineSettings,
    Hooks,
    RunTrace,
    SkipClock,
    TenantSample,
    drive,
)
from bench.workloads import Span
from engine.tenants import ServiceCost


def samples(*steps: tuple[int, int, int, int]) -> RunTrace:
    """Steps of (A output tokens, A queued, B output tokens, B queued)."""
    trace = RunTrace([], [], [], [], 0.0, 0.0, 0.0, 0.0)
    for i, (a, qa, b, qb) in enumerate(steps):
        trace.tenants.append((float(i), (TenantSample("A", 0, a, qa), TenantSample("B", 0, b, qb))))
    return trace


def test_the_difference_is_over_the_longest_stretch_both_waited() -> None:
    trace = samples(
        (0, 1, 0, 0),  # B not waiting: outside any stretch
        (10, 1, 0, 1),
        (12, 1, 4, 1),  # difference (2*): 20, 16
        (13, 1, 10, 1),  # 6
        (14, 1, 11, 1),  # 6
        (50, 1, 11, 0),  # B idle again: A's lead here is not counted
    )
    found = backlogged(trace, ServiceCost(), "A", "B")
    assert found.seconds == 3.0
    assert found.max_difference == pytest.approx(2 * (10 - 0) - 2 * (14 - 11))  # 20 - 6
    assert found.service_ratio == pytest.approx((14 - 10) / (11 - 0))
    weighted = backlogged(trace, ServiceCost(weights={"A": 2.0}), "A", "B")
    assert weighted.max_difference == pytest.approx(10 - (-8))  # A: 10, 4; B ahead: -7, -8
    assert backlogged(samples((1, 0, 1, 0)), ServiceCost(), "A", "B").seconds == 0.0


def test_a_real_run_samples_each_tenants_service(tiny_model_dir: Path) -> None:
    factory = EngineFactory(tiny_model_dir)
    shape = (Span(8, 24), Span(4, 4))
    workload = merged(
        "pair",
        poisson(400.0, 0.05, shape, factory.vocab_size, 1, "A", 0),
        poisson(100.0, 0.05, shape, factory.vocab_size, 1, "B", 0),
    )
    settings = EngineSettings("continuous", kv_tokens=4096, queue=queue(name="fair"))
    engine, recorder = factory.build(settings, SkipClock())
    trace = drive(engine, recorder, workload, Hooks(watch_tenants=True))
    assert len(trace.requests) == len(workload.requests) and trace.tenants
    last = {s.tenant: s for s in trace.tenants[-1][1]}
    for tenant in ("A", "B"):
        mine = [r for r in workload.requests if r.tenant == tenant]
        assert last[tenant].output_tokens == 4 * len(mine)
        assert last[tenant].input_tokens == sum(len(r.prompt) for r in mine)
        assert {r.tenant for r in trace.requests if r.tenant == tenant} == {tenant}
