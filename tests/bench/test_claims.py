"""Verdicts follow the measured numbers and the stated thresholds, never a fixed answer."""

from __future__ import annotations

from dataclasses import replace

from bench.claims import CLAIMS, CLAIMS_BY_NUMBER, judge_claim, multiplier_values, verdicts
from bench.evidence import FAILS, HOLDS, MISSING, SHAPE, Evidence
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
    return judge_claim(1, runs, base=100, large=500).verdict


def test_a_throughput_claim_follows_the_measured_ratio():
    assert verdict_of_claim_one(150, 100) == HOLDS
    assert verdict_of_claim_one(110, 100) == SHAPE
    assert verdict_of_claim_one(400, 100) == SHAPE  # right direction, much larger gap
    assert verdict_of_claim_one(95, 100) == FAILS


def test_a_claim_without_its_runs_is_not_measured():
    found = verdicts([], base=100, large=500)
    assert [v.number for v in found] == list(range(1, 12))
    assert {v.verdict for v in found} == {MISSING}


def test_kv_utilization_claim_uses_both_figures():
    runs = [burst("continuous", 1, kv=0.96), burst("dynamic", 1, kv=0.70)]
    assert judge_claim(4, runs, 100, None).verdict == HOLDS
    runs = [burst("continuous", 1, kv=0.88), burst("dynamic", 1, kv=0.60)]
    assert judge_claim(4, runs, 100, None).verdict == SHAPE
    runs = [burst("continuous", 1, kv=0.80), burst("dynamic", 1, kv=0.78)]
    assert judge_claim(4, runs, 100, None).verdict == FAILS


def test_reserve_claim_needs_failures_to_cut():
    def reserve(value: float, preempted: int) -> dict:
        return {
            "suite": "reserve",
            "memory_reserve": value,
            "preemptions": preempted,
            "refused": 0,
            "output_throughput": 10.0,
        }

    runs = [reserve(0.0, 0), reserve(0.10, 0), reserve(0.15, 0)]
    assert judge_claim(8, runs, 100, None).verdict == FAILS
    runs = [reserve(0.0, 10), reserve(0.10, 2), reserve(0.15, 1)]
    assert judge_claim(8, runs, 100, None).verdict == HOLDS


def test_a_claims_text_threshold_and_verdict_read_one_number():
    """The article's figure is named once: change it and the text, the threshold and the
    verdict all follow."""
    runs = [burst("continuous", 240), burst("dynamic", 100)]
    claim = CLAIMS_BY_NUMBER[1]
    as_written = claim.judge(Evidence(runs, 100, 500))
    assert "1.5×" in as_written.claim and as_written.verdict == SHAPE
    assert as_written.threshold == "holds if 1.20× ≤ ratio ≤ 1.88×; in shape if ratio > 1.05×"
    restated = replace(claim, values=multiplier_values(2.4)).judge(Evidence(runs, 100, 500))
    assert "2.4×" in restated.claim and "1.5" not in restated.claim
    assert restated.threshold == "holds if 1.92× ≤ ratio ≤ 3.00×; in shape if ratio > 1.05×"
    assert restated.verdict == HOLDS


def test_the_registry_numbers_each_claim_once_in_order():
    assert [c.number for c in CLAIMS] == list(range(1, 12))
    for claim in CLAIMS:  # every template names only values it has
        claim.judge(Evidence([], 100, 500))


def test_targets_report_missing_runs_as_unknown():
    assert all(t.met is None for t in targets([], 100))
