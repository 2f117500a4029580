"""Verdicts follow the measured numbers and the stated thresholds, never a fixed answer."""

from __future__ import annotations

from bench.claims import FAILS, HOLDS, MISSING, SHAPE, Judge
from bench.targets import targets


def burst(policy: str, throughput: float, concurrency: int = 100, **extra) -> dict:
    return {
        "suite": "burst",
        "policy": policy,
        "workload": "burst-fixed",
        "concurrency": concurrency,
        "output_throughput": throughput,
        "ttft_p50": extra.get("ttft_p50", 1.0),
        "ttft_p99": extra.get("ttft_p99", 2.0),
        "kv_utilization": extra.get("kv", 0.9),
        "queue_time_p50": 0.5,
        "e2e_p50": 1.0,
    }


def verdict_of_claim_one(continuous: float, dynamic: float) -> str:
    runs = [burst("continuous", continuous), burst("dynamic", dynamic)]
    return Judge(runs, base=100, large=500).c1().verdict


def test_a_throughput_claim_follows_the_measured_ratio():
    assert verdict_of_claim_one(150, 100) == HOLDS
    assert verdict_of_claim_one(110, 100) == SHAPE
    assert verdict_of_claim_one(400, 100) == SHAPE  # right direction, much larger gap
    assert verdict_of_claim_one(95, 100) == FAILS


def test_a_claim_without_its_runs_is_not_measured():
    verdicts = Judge([], base=100, large=500).all()
    assert len(verdicts) == 11
    assert {v.verdict for v in verdicts} == {MISSING}


def test_kv_utilization_claim_uses_both_figures():
    runs = [burst("continuous", 1, kv=0.96), burst("dynamic", 1, kv=0.70)]
    assert Judge(runs, 100, None).c4().verdict == HOLDS
    runs = [burst("continuous", 1, kv=0.88), burst("dynamic", 1, kv=0.60)]
    assert Judge(runs, 100, None).c4().verdict == SHAPE
    runs = [burst("continuous", 1, kv=0.80), burst("dynamic", 1, kv=0.78)]
    assert Judge(runs, 100, None).c4().verdict == FAILS


def test_reserve_claim_needs_failures_to_cut():
    def reserve(value: float, preempted: int) -> dict:
        return {
            "suite": "reserve",
            "memory_reserve": value,
            "preemptions": preempted,
            "refused": 0,
            "output_throughput": 10.0,
        }

    judge = Judge([reserve(0.0, 0), reserve(0.10, 0), reserve(0.15, 0)], 100, None)
    assert judge.c8().verdict == FAILS
    judge = Judge([reserve(0.0, 10), reserve(0.10, 2), reserve(0.15, 1)], 100, None)
    assert judge.c8().verdict == HOLDS


def test_targets_report_missing_runs_as_unknown():
    assert all(t.met is None for t in targets([], 100))
