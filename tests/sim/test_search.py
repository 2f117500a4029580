"""Capacity search against answers known by hand: a synthetic cost model (fixed costs per
token and per step) on which a single-slot engine is a queue whose capacity is 1 / service."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.simulate import run
from sim.cost_model import CostModel, StepShape
from sim.search import Grid, Slo, format_search, judge, max_rate, scaled, search, search_trace
from sim.simulator import SimSetup, simulate
from sim.trace import TraceRequest, Uniform, poisson_trace, write_trace

PROMPT, OUTPUT, N = 100, 11, 100
PER_TOKEN = 1e-3


class PerToken(CostModel):
    """A step costs ``per_step`` plus ``per_token`` for every token it computes."""

    def __init__(self, per_token: float = PER_TOKEN, per_step: float = 0.0) -> None:
        self.per_token, self.per_step = per_token, per_step
        self.name = f"per-token-{per_token:g}-{per_step:g}"

    def step_time(self, shape: StepShape) -> float:
        return self.per_step + self.per_token * shape.num_tokens


# One slot: a request is a prefill step of PROMPT tokens (its first token at the end) and
# OUTPUT - 1 one-token decode steps; nothing overlaps, so the service time and the capacity are
SERVICE = PER_TOKEN * (PROMPT + OUTPUT - 1)
CAPACITY = 1 / SERVICE
ONE_SLOT = SimSetup(num_kv_blocks=256, max_num_seqs=1)


def uniform(rate: float) -> list[TraceRequest]:
    """Evenly spaced arrivals: below capacity each finds the engine idle, TTFT = its prefill."""
    return [TraceRequest(i / rate, PROMPT, OUTPUT) for i in range(N)]


def test_slo_parse() -> None:
    slo = Slo.parse("ttft_p99=500ms, tpot_p50=0.05,attainment=90%")
    assert [(t.metric, t.percentile, t.seconds) for t in slo.targets] == [
        ("ttft", 99.0, 0.5),
        ("tpot", 50.0, 0.05),
    ]
    assert slo.attainment == pytest.approx(0.9)
    assert Slo.parse(str(slo)) == slo
    for bad in ("", "ttft=1", "speed_p99=1", "ttft_p99=-1", "ttft_p99", "attainment=2,ttft_p9=1"):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def test_below_capacity_ttft_is_the_prefill_and_above_it_the_queue_grows() -> None:
    slo = Slo.parse(f"ttft_p99={1.5 * PER_TOKEN * PROMPT}")
    below = simulate(uniform(0.99 * CAPACITY), PerToken(), "continuous", ONE_SLOT)
    assert {round(r.metrics.ttft, 9) for r in below.records} == {PER_TOKEN * PROMPT}
    assert judge(below, N, slo, 0.99 * CAPACITY).meets
    above = simulate(uniform(1.1 * CAPACITY), PerToken(), "continuous", ONE_SLOT)
    assert not judge(above, N, slo, 1.1 * CAPACITY).meets


def test_search_finds_the_analytic_capacity() -> None:
    """Over capacity the k-th request waits k * (SERVICE - gap); with 100 requests the p99
    passes 1.5 x the prefill once the gap is ~0.5 % short of SERVICE: the answer lies within
    [CAPACITY x (1 - tol), CAPACITY x 1.01]."""
    slo = Slo.parse(f"ttft_p99={1.5 * PER_TOKEN * PROMPT}")
    grid = Grid(max_num_seqs=(1,), max_num_batched_tokens=(2048,), memory_reserve=(0.1,))
    result = search(uniform, PerToken(), ["continuous"], slo, grid, ONE_SLOT, rel_tol=0.01)
    found = result.best("continuous")
    assert found is not None and found.best is not None
    assert CAPACITY * 0.99 <= found.rate <= CAPACITY * 1.01
    assert found.best.observed["ttft_p99"] <= 1.5 * PER_TOKEN * PROMPT
    assert all(p.meets == (p.rate <= found.rate) for p in found.probes)  # monotone, bracketed
    assert "continuous: " in format_search(result) and "max_num_seqs=1" in format_search(result)


def test_an_slo_below_the_physics_has_no_rate() -> None:
    """TPOT is one decode step (PER_TOKEN) at any rate: a tighter bound is never met."""
    slo = Slo.parse(f"tpot_p99={0.9 * PER_TOKEN}")
    best, probes = max_rate(
        lambda rate: judge(
            simulate(uniform(rate), PerToken(), "continuous", ONE_SLOT), N, slo, rate
        )
    )
    assert best is None and all(not p.meets for p in probes)


def test_more_slots_more_capacity_and_the_search_recommends_them() -> None:
    """With a fixed cost per step (none per token) M slots serve M requests per OUTPUT steps:
    capacity M / (OUTPUT x step). Poisson arrivals queue below that, never above it."""
    step = 0.01
    cost = PerToken(per_token=0.0, per_step=step)
    base = poisson_trace(1.0, 200, Uniform(PROMPT, PROMPT), Uniform(OUTPUT, OUTPUT), seed=3)
    slo = Slo.parse(f"ttft_p90={3 * step}")
    grid = Grid(max_num_seqs=(2, 8), max_num_batched_tokens=(2048,), memory_reserve=(0.1,))
    setup = SimSetup(num_kv_blocks=1024)
    result = search(scaled(base), cost, ["continuous"], slo, grid, setup)
    small, large = result.capacities
    for c in (small, large):
        bound = c.setup.max_num_seqs / (OUTPUT * step)
        assert 0.2 * bound <= c.rate <= 1.05 * bound, (c.rate, bound)
    assert large.rate > 2.5 * small.rate
    assert result.best("continuous") is large
    again = search(scaled(base), cost, ["continuous"], slo, grid, setup)
    assert [c.rate for c in again.capacities] == [c.rate for c in result.capacities]


def test_refused_and_unfinished_requests_miss_every_target() -> None:
    result = simulate(uniform(1.0), PerToken(), "continuous", ONE_SLOT)
    probe = judge(result, N + N, Slo.parse("ttft_p50=10"), 1.0)  # half the trace missing
    assert probe.attained == pytest.approx(0.5)
    assert not probe.meets and math.isinf(probe.observed["ttft_p50"] or 0)


def test_padded_policies_group_up_to_the_setting() -> None:
    grid = Grid(max_num_seqs=(4,), max_num_batched_tokens=(2048,), memory_reserve=(0.0,))
    slo = Slo.parse("ttft_p99=10")
    result = search(uniform, PerToken(), ["dynamic"], slo, grid, ONE_SLOT, start_rate=CAPACITY)
    (cap,) = result.capacities
    assert cap.spec.params.model_dump() == {"max_batch_size": 4}
    assert cap.best is not None and "max_batch_size=4" in format_search(result)


def test_a_recorded_trace_keeps_its_lengths_and_is_made_denser() -> None:
    recorded = [TraceRequest(10.0, 5, 3), TraceRequest(12.0, 7, 2), TraceRequest(14.0, 9, 1)]
    at_2 = search_trace(recorded)(2.0)  # recorded at 0.5 req/s: gaps of 2 s become 0.5 s
    assert [r.arrived_at for r in at_2] == [0.0, 0.5, 1.0]
    assert [(r.num_prefill_tokens, r.num_decode_tokens) for r in at_2] == [(5, 3), (7, 2), (9, 1)]
    poisson = search_trace(n=50, seed=4)
    assert [r.arrived_at * 3 for r in poisson(3.0)] == pytest.approx(
        [r.arrived_at for r in poisson(1.0)]
    )


def test_grid_of_comma_separated_values() -> None:
    grid = Grid.of(max_num_seqs="8, 32", memory_reserve="0,0.2", max_num_batched_tokens=None)
    assert (grid.max_num_seqs, grid.memory_reserve) == ((8, 32), (0.0, 0.2))
    assert grid.max_num_batched_tokens == Grid().max_num_batched_tokens
    assert len(grid.settings(SimSetup())) == 2 * 2 * len(Grid().max_num_batched_tokens)


def test_servedeck_simulate_search_prints_the_recommended_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "recorded.csv"
    write_trace(path, [TraceRequest(i * 0.5, 500 + 50 * i, 20) for i in range(30)])
    argv = ["--profile", "a100-80g/llama3-8b", "--trace", str(path), "--policies", "continuous"]
    argv += ["--search", "--slo", "ttft_p99=400ms", "--search-requests", "20"]
    argv += ["--search-max-num-seqs", "4,16", "--search-max-num-batched-tokens", "2048"]
    assert run([*argv, "--search-memory-reserve", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "SLO ttft_p99=400ms on a100-80g/llama3-8b (predicted, not measured)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("continuous ")]
    assert [row[1] for row in rows] == ["4", "16"] and all(float(row[4]) > 0 for row in rows)
    assert "continuous: " in out.split("recommended:")[1]
