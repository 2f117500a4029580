"""The simulator drives the real engine: the server's classes, arrivals as they come, every
policy to completion, the same figures for the same seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.batch import ScheduledBatch, StepResult
from engine.kv_cache import BlockManager
from engine.runner import Runner
from policies.registry import POLICIES
from serving.engine import LLMEngine
from sim.clock import VirtualClock
from sim.cost_model import CostModel, StepShape
from sim.runner import CostModelRunner
from sim.simulator import SimSetup, simulate
from sim.trace import TraceRequest, Uniform, poisson_trace, read_trace, write_trace

SETUP = SimSetup(num_kv_blocks=2048, max_num_seqs=32, max_num_batched_tokens=512)


class LinearCost(CostModel):
    """10 ms a step plus 20 µs a token: simple enough to reason about, a real CostModel."""

    name = "linear"

    def step_time(self, shape: StepShape) -> float:
        return 0.010 + 20e-6 * shape.num_tokens


def small_trace(seed: int = 1, n: int = 40) -> list[TraceRequest]:
    return poisson_trace(20.0, n, Uniform(20, 300), Uniform(1, 40), seed)


def test_clock_moves_only_forward() -> None:
    clock = VirtualClock()
    clock.advance(1.5)
    clock.advance_to(1.0)
    assert clock() == 1.5
    clock.advance_to(2.0)
    assert clock() == 2.0
    with pytest.raises(ValueError):
        clock.advance(-1)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_simulator_runs_the_classes_the_server_runs(name: str) -> None:
    result = simulate(small_trace(n=5), LinearCost(), name, SETUP)
    engine = result.engine
    assert type(engine) is LLMEngine
    assert type(engine.policy) is POLICIES[name]
    assert type(engine.blocks) is BlockManager
    assert type(engine.runner) is CostModelRunner


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_a_trace_to_completion(name: str) -> None:
    trace = small_trace()
    result = simulate(trace, LinearCost(), name, SETUP)
    assert sorted(r.index for r in result.records) == list(range(len(trace)))
    for record in result.records:
        assert record.finish_reason == "length"
        assert record.output_tokens == trace[record.index].num_decode_tokens
        assert record.prompt_tokens == trace[record.index].num_prefill_tokens
        assert record.metrics.arrival_time == trace[record.index].arrived_at
    stats = result.engine.kv_stats()
    assert stats.used == 0  # every block came back


def test_same_seed_same_figures_other_seed_other_figures() -> None:
    def figures(seed: int) -> list[tuple]:
        result = simulate(small_trace(seed), LinearCost(), "continuous", SETUP)
        return sorted((r.index, r.metrics.ttft, r.metrics.e2e) for r in result.records)

    assert figures(3) == figures(3)
    assert figures(3) != figures(4)


def test_requests_enter_only_once_they_have_arrived() -> None:
    """No step computes a request before its arrival: were the trace added up front with its
    arrival times, the policy would schedule later arrivals early and this would fail."""
    trace = small_trace(n=60)
    step_starts: list[float] = []

    class Watch:
        def __init__(self, inner: CostModelRunner) -> None:
            self.inner = inner

        @property
        def last_forward_s(self) -> float:
            return self.inner.last_forward_s

        def execute(self, batch: ScheduledBatch) -> StepResult:
            now = self.inner.clock()
            step_starts.append(now)
            for entry in batch.entries:
                index = int(entry.seq.seq_id.removeprefix("r"))
                assert entry.seq.arrival_time == trace[index].arrived_at <= now
            return self.inner.execute(batch)

    def wrap(runner: Runner) -> Runner:
        assert isinstance(runner, CostModelRunner)
        return Watch(runner)

    result = simulate(trace, LinearCost(), "continuous", SETUP, wrap_runner=wrap)
    assert len(result.records) == len(trace)
    assert step_starts[0] == 0.0 and step_starts[-1] >= trace[-1].arrived_at
    for record in result.records:
        assert record.metrics.first_scheduled_time >= record.metrics.arrival_time


def test_shared_prefix_is_shared_and_nothing_else() -> None:
    lone = [TraceRequest(0.1 * i, 200, 4) for i in range(6)]
    shared = [TraceRequest(0.1 * i, 200, 4, shared_prefix=128) for i in range(6)]
    cached = [
        sum(
            r.metrics.num_cached_tokens
            for r in simulate(t, LinearCost(), "continuous", SETUP).records
        )
        for t in (lone, shared)
    ]
    assert cached[0] == 0
    assert cached[1] >= 5 * 128


def test_trace_csv_round_trips(tmp_path: Path) -> None:
    for trace in (small_trace(), [TraceRequest(0.5, 100, 10, 64), TraceRequest(1.25, 70, 3)]):
        path = tmp_path / "trace.csv"
        write_trace(path, trace)
        assert read_trace(path) == trace
    assert (
        path.read_text().splitlines()[0]
        == "arrived_at,num_prefill_tokens,num_decode_tokens,shared_prefix"
    )


FIGURES_SCRIPT = """
from sim.simulator import SimSetup, simulate
from sim.trace import Uniform, poisson_trace
from tests.sim.test_simulator import LinearCost
trace = poisson_trace(40.0, 60, Uniform(100, 400), Uniform(50, 200), 5)
for name in ("continuous", "dynamic", "hybrid", "static"):
    r = simulate(trace, LinearCost(), name, SimSetup(num_kv_blocks=60, max_num_seqs=32))
    print(name, sum(s.preempted for s in r.steps),
          sorted((x.index, x.metrics.ttft, x.metrics.e2e) for x in r.records))
"""


def test_same_figures_in_another_process_with_another_hash_seed() -> None:
    """Nothing in the engine or the simulator may depend on set or str-hash order."""
    root = Path(__file__).resolve().parents[2]

    def run(hash_seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
        done = subprocess.run(
            [sys.executable, "-c", FIGURES_SCRIPT], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = run("1")
    assert first == run("2")
    assert "continuous 0 " not in first  # the small pool makes continuous preempt
