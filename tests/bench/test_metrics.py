"""Metric definitions on hand-made timestamps and step records."""

from __future__ import annotations

import pytest

from bench.metrics import Slo, engine_metrics, overhead, request_itls, request_metrics
from bench.recording import StepTokens
from bench.runner import RequestRecord, RunTrace
from engine.outputs import RequestMetrics
from engine.stats import StepRecord, percentile


def record(arrival: float, token_times: list[float], prompt: int = 10, index: int = 0):
    timing = RequestMetrics(
        arrival_time=arrival,
        first_scheduled_time=arrival,
        first_token_time=token_times[0] if token_times else None,
        token_times=token_times,
        finish_time=token_times[-1] if token_times else None,
    )
    return RequestRecord(index=index, tag="", prompt_tokens=prompt, metrics=timing)


def step(
    wall: float,
    forward: float,
    seqs: int = 1,
    held: int = 0,
    live: int = 0,
    prefill: int = 0,
    decode: int = 0,
    padded: int = 0,
) -> StepRecord:
    return StepRecord(
        time=0.0,
        wall_s=wall,
        forward_s=forward,
        mode="",
        num_seqs=seqs,
        prefill_tokens=prefill,
        decode_tokens=decode,
        padded_tokens=padded,
        generated_tokens=decode,
        preempted=0,
        kv_held_slots=held,
        kv_live_tokens=live,
    )


def trace(steps: list[StepRecord], tokens: list[StepTokens] | None = None) -> RunTrace:
    tokens = tokens or [StepTokens() for _ in steps]
    return RunTrace([], steps, tokens, [], 0.0, 1.0, 0.0, 0.0)


def test_ttft_counts_from_arrival_not_from_scheduling():
    r = record(arrival=1.0, token_times=[1.5, 1.7, 2.0])
    r.metrics.first_scheduled_time = 1.4
    assert r.metrics.ttft == pytest.approx(0.5)


def test_tpot_is_e2e_minus_ttft_over_output_tokens_minus_one():
    r = record(arrival=0.0, token_times=[1.0, 1.5, 3.0])  # e2e 3.0, ttft 1.0
    assert r.metrics.tpot == pytest.approx((3.0 - 1.0) / 2)


def test_tpot_is_undefined_for_a_single_token():
    assert record(0.0, [0.4]).metrics.tpot is None


def test_itl_lists_every_gap_between_tokens():
    assert request_itls(record(0.0, [1.0, 1.5, 3.0])) == pytest.approx([0.5, 1.5])


def test_percentile_interpolates_linearly_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_throughput_divides_completed_tokens_by_the_duration():
    records = [record(0.0, [1.0, 2.0], prompt=10), record(0.0, [1.0, 1.5, 4.0], prompt=6, index=1)]
    m = request_metrics(records, duration=4.0, slo=None)
    assert m["completed"] == 2
    assert m["output_throughput"] == pytest.approx(5 / 4)
    assert m["total_throughput"] == pytest.approx((5 + 16) / 4)
    assert m["request_throughput"] == pytest.approx(0.5)
    assert m["ttft_p50"] == pytest.approx(1.0)
    assert m["e2e_p50"] == pytest.approx(3.0)
    assert m["itl_p50"] == pytest.approx(1.0)  # gaps 1.0, 0.5, 2.5


def test_goodput_counts_requests_meeting_every_slo():
    fast = record(0.0, [0.1, 0.2, 0.3])
    slow_first = record(0.0, [2.0, 2.1], index=1)
    slow_tokens = record(0.0, [0.1, 1.1], index=2)
    m = request_metrics([fast, slow_first, slow_tokens], duration=2.0, slo=Slo(1.0, 0.5))
    assert m["goodput"] == pytest.approx(1 / 2.0)


def test_kv_utilization_is_a_ratio_of_sums_over_steps():
    steps = [step(1, 1, held=100, live=50), step(1, 1, held=300, live=290)]
    # a mean of per-step ratios would be (0.5 + 0.967) / 2 = 0.73; the ratio of sums is 0.85
    assert engine_metrics(trace(steps))["kv_utilization"] == pytest.approx(340 / 400)


def test_padding_waste_is_split_into_prefill_and_decode():
    tokens = [
        StepTokens(prefill=60, prefill_pads=40),
        StepTokens(decode=3, decode_pads=1),
        StepTokens(decode=2, decode_pads=2),
    ]
    m = engine_metrics(trace([step(1, 1) for _ in tokens], tokens))
    assert m["padding_waste_prefill"] == pytest.approx(40 / 100)
    assert m["padding_waste_decode"] == pytest.approx(3 / 8)
    assert m["padding_waste"] == pytest.approx(43 / 108)


def test_engine_overhead_leaves_out_the_bench_bookkeeping():
    steps = [step(1.0, 0.9, seqs=40), step(1.0, 0.5, seqs=4)]
    tokens = [StepTokens(instrument_s=0.05), StepTokens(instrument_s=0.0)]
    t = trace(steps, tokens)
    assert overhead(t) == pytest.approx((1.95 - 1.4) / 1.95)
    assert overhead(t, min_seqs=32) == pytest.approx((0.95 - 0.9) / 0.95)


def test_results_carry_vllm_bench_serves_keys_in_its_units() -> None:
    """The same figures under ``vllm bench serve``'s names: milliseconds, ``e2el``, goodput."""
    records = [record(0.0, [1.0, 2.0], prompt=10), record(0.0, [1.0, 1.5, 4.0], prompt=6, index=1)]
    m = request_metrics(records, duration=4.0, slo=Slo(2.0, 2.0))
    assert m["output_throughput"] == pytest.approx(5 / 4)  # the same key, already vLLM's
    assert m["total_token_throughput"] == m["total_throughput"]
    assert (m["total_input_tokens"], m["total_output_tokens"], m["duration"]) == (16, 5, 4.0)
    assert m["median_ttft_ms"] == pytest.approx(1000.0)
    assert m["p99_ttft_ms"] == pytest.approx(m["ttft_p99"] * 1000)
    assert m["mean_tpot_ms"] == pytest.approx(m["tpot_mean"] * 1000)
    assert m["median_itl_ms"] == pytest.approx(1000.0)
    assert m["median_e2el_ms"] == pytest.approx(3000.0)
    assert m["request_goodput"] == m["goodput"]
