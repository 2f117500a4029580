"""A simulated run reports its waiting by reason (issue 41, in the simulator): the engine's own
recorder, read once at the end, in ``SimResult.waits``, ``servedeck simulate``'s output and the
dry run's ``SettingPrediction``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.simulate import run, wait_line
from control.guardrail.prediction_worker import simulate_settings
from control.policy.schemas import PolicySettings, SettingPrediction
from engine.config import EngineLimits
from engine.timeline import HeldShare, WaitReason
from policies.spec import default_spec
from sim.cost_model import CostModel, StepShape
from sim.simulator import SimResult, SimSetup, simulate
from sim.trace import TraceRequest, write_trace

BURST = [TraceRequest(0.0, 200, 30) for _ in range(12)]
"""Twelve prompts of 13 blocks at once: a 40-block pool admits three at a time."""
STARVED = SimSetup(num_kv_blocks=40, max_num_seqs=32, max_num_batched_tokens=4096)


class LinearCost(CostModel):
    name = "linear"

    def step_time(self, shape: StepShape) -> float:
        return 0.010 + 20e-6 * shape.num_tokens


def waited_by_requests(result: SimResult) -> dict[WaitReason, float]:
    """The same run's waiting summed over its finished requests' own timelines."""
    assert result.engine is not None
    by: dict[WaitReason, float] = {}
    for timeline in result.engine.timelines.finished_since(-math.inf):
        for reason, seconds in timeline.waited().items():
            by[reason] = by.get(reason, 0.0) + seconds
    return by


def test_a_kv_starved_run_reports_kv_blocks_short() -> None:
    result = simulate(BURST, LinearCost(), "continuous", STARVED)
    assert len(result.records) == len(BURST)
    shares = HeldShare.fractions(result.waits)
    assert shares[WaitReason.KV_BLOCKS_SHORT] > 0
    assert sum(shares.values()) == pytest.approx(1.0)
    # the seconds are the requests' own waiting, reason by reason
    by_requests = waited_by_requests(result)
    assert {s.reason: s.seconds for s in result.waits} == pytest.approx(by_requests)
    assert sum(s.seconds for s in result.waits) > 0
    line = wait_line(result.waits)
    assert line.startswith("  waiting by reason: kv_blocks_short ")


def test_a_run_with_no_waiting_reports_none() -> None:
    result = simulate([TraceRequest(0.0, 20, 3)], LinearCost(), "continuous", STARVED)
    assert len(result.records) == 1
    assert result.waits == ()
    assert HeldShare.fractions(result.waits) == {}
    assert wait_line(result.waits) == "  waiting by reason: none"


def test_a_full_batch_reports_max_num_seqs() -> None:
    setup = SimSetup(num_kv_blocks=4096, max_num_seqs=2, max_num_batched_tokens=4096)
    result = simulate(BURST, LinearCost(), "continuous", setup)
    shares = HeldShare.fractions(result.waits)
    assert shares[WaitReason.MAX_NUM_SEQS] > 0 and WaitReason.KV_BLOCKS_SHORT not in shares
    assert sum(shares.values()) == pytest.approx(1.0)


def test_servedeck_simulate_prints_the_share_by_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "burst.csv"
    write_trace(trace, BURST)
    argv = ["--profile", "a100-80g/llama3-8b", "--trace", str(trace), "--num-kv-blocks", "40"]
    assert run([*argv, "--policies", "continuous", "--out", str(tmp_path), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    (line,) = [x for x in printed.splitlines() if "waiting by reason" in x]
    assert "kv_blocks_short" in line and "%" in line


def test_the_dry_run_prediction_carries_the_waits() -> None:
    limits = EngineLimits(
        block_size=16, num_kv_blocks=4096, max_model_len=4096, max_num_seqs=2,
        max_num_batched_tokens=2048,
    )  # fmt: skip
    setting = PolicySettings(
        policy=default_spec("continuous"), memory_reserve=0.1, reclaim_interval_s=60.0
    )
    (found,) = simulate_settings("a100-80g/llama3-8b", BURST, limits, [setting], math.inf)
    shares = HeldShare.fractions(found.waits)
    assert shares[WaitReason.MAX_NUM_SEQS] > 0
    assert sum(shares.values()) == pytest.approx(1.0)
    body = found.model_dump(mode="json")
    assert {w["reason"] for w in body["waits"]} >= {"max_num_seqs"}
    assert SettingPrediction.model_validate(body) == found
    # an older body without the field still reads (nothing waited)
    del body["waits"]
    assert SettingPrediction.model_validate(body).waits == []
