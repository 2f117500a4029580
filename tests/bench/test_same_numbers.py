"""The report and the engine's own statistics (what ``/admin/state`` shows) agree: TTFT, TPOT
and e2e come from ``RequestMetrics`` and their percentiles from ``engine.stats``, once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.metrics import request_metrics
from bench.runner import EngineFactory, EngineSettings, SkipClock, drive
from bench.workloads import Request, Workload
from engine.stats import PERCENTILES


@pytest.fixture(scope="module")
def factory(tiny_model_dir: Path) -> EngineFactory:
    return EngineFactory(tiny_model_dir)


@pytest.mark.parametrize("policy", ["continuous", "dynamic"])
def test_the_report_and_admin_state_give_the_same_latencies(factory: EngineFactory, policy: str):
    rng = random.Random(7)
    requests = tuple(
        Request(
            tuple(rng.randrange(2, 4000) for _ in range(rng.randint(4, 40))),
            max_tokens=rng.randint(2, 12),
            arrival=0.01 * i,
        )
        for i in range(12)
    )
    engine, recorder = factory.build(EngineSettings(policy, kv_tokens=4096), SkipClock())
    trace = drive(engine, recorder, Workload("mixed-lengths", requests))
    assert len(trace.requests) == len(requests)

    report = request_metrics(trace.requests, trace.end - trace.start, slo=None)
    state = engine.stats.latency(engine.clock())
    shared = [q for q in PERCENTILES if f"ttft_p{q}" in report]
    assert shared == [50, 99]
    for name in ("ttft", "tpot", "e2e"):
        for q in shared:
            assert report[f"{name}_p{q}"] is not None
            assert report[f"{name}_p{q}"] == state[name][f"p{q}"], (name, q)
