"""Serving metrics with vLLM's ``benchmark_serving`` definitions, plus the engine's own.

Request metrics (seconds, from each request's own timestamps), defined once by the engine's
``RequestMetrics`` and summarised by ``engine.stats`` (so ``/admin/state`` agrees):
- TTFT = first token - arrival (queueing included);
- TPOT = (last token - first token) / (output tokens - 1), for requests with more than one
  output token: (e2e - TTFT) / (output tokens - 1) for a request that ends at its last token,
  as every engine request does (vLLM's definition);
- ITL = every gap between consecutive tokens of a request, pooled over requests;
- e2e = finish - arrival;
- throughput = tokens (or requests) completed / duration, duration = run start to last finish;
- goodput = completed requests meeting every stated SLO / duration.
Percentiles interpolate linearly between order statistics (numpy's default).

Engine metrics (from the per-step records):
- KV utilization = sum over steps of tokens stored / sum over steps of slots held, both as
  the engine records them after the step's writes: a ratio of sums, each step weighted by the
  slots it holds, not by its duration. Slots a padded policy reserves for padding or for
  tokens not generated yet count as held, so padding shows;
- padding waste = padded / computed tokens, prefill and decode apart;
- engine overhead = (sum of step wall time - sum of forward time) / sum of step wall time, with
  the bench's own bookkeeping taken out of the wall time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.stats import mean, percentile

if TYPE_CHECKING:
    from bench.runner import RequestRecord, RunTrace

QUANTILES = (50, 90, 99)
THROUGHPUT_KEYS = ("output_throughput", "total_throughput")
TTFT_KEYS = ("ttft_p50", "ttft_p99")
LATENCY_KEYS = (*TTFT_KEYS, "tpot_p50", "e2e_p50")
"""Run keys the report and the ratios show together, named once."""


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float
    tpot_s: float

    def met_by(self, record: RequestRecord) -> bool:
        ttft = record.metrics.ttft
        tpot = record.metrics.tpot or 0.0
        return ttft is not None and ttft <= self.ttft_s and tpot <= self.tpot_s


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def request_itls(r: RequestRecord) -> list[float]:
    return [b - a for a, b in itertools.pairwise(r.metrics.token_times)]


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def distribution(name: str, values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"{name}_mean": mean(values)}
    for q in QUANTILES:
        out[f"{name}_p{q}"] = percentile(values, q)
    return out


VLLM_LATENCIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
"""Our latency names -> ``vllm bench serve``'s (its end-to-end latency is ``e2el``)."""


def vllm_result_keys(metrics: dict[str, Any]) -> dict[str, Any]:
    """The same figures under the keys of ``vllm bench serve --save-result``, so a result can be
    read beside vLLM's own: ``total_input_tokens``, ``output_throughput``, ``total_token_
    throughput``, ``request_goodput``, and per latency ``mean_X_ms``, ``median_X_ms`` and
    ``pNN_X_ms`` in milliseconds (vLLM's ``std_X_ms`` has no counterpart here)."""
    out: dict[str, Any] = {
        "duration": metrics["duration_s"],
        "total_input_tokens": metrics["prompt_tokens"],
        "total_output_tokens": metrics["output_tokens"],
        "total_token_throughput": metrics["total_throughput"],
    }
    if "goodput" in metrics:
        out["request_goodput"] = metrics["goodput"]
    for ours, theirs in VLLM_LATENCIES.items():
        out[f"mean_{theirs}_ms"] = _ms(metrics.get(f"{ours}_mean"))
        out[f"median_{theirs}_ms"] = _ms(metrics.get(f"{ours}_p50"))
        for q in QUANTILES:
            out[f"p{q}_{theirs}_ms"] = _ms(metrics.get(f"{ours}_p{q}"))
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def request_metrics(
    records: Sequence[RequestRecord], duration: float, slo: Slo | None
) -> dict[str, Any]:
    """Throughput and latency over completed requests (vLLM's ``calculate_metrics``)."""
    done = [r for r in records if r.finish is not None]
    prompt = sum(r.prompt_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    out: dict[str, Any] = {
        "completed": len(done),
        "duration_s": duration,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "request_throughput": ratio(len(done), duration),
        "output_throughput": ratio(output, duration),
        "total_throughput": ratio(prompt + output, duration),
    }
    out |= distribution("ttft", _present(r.metrics.ttft for r in done))
    out |= distribution("tpot", _present(r.metrics.tpot for r in done))
    out |= distribution("itl", [gap for r in done for gap in request_itls(r)])
    out |= distribution("e2e", _present(r.metrics.e2e for r in done))
    out |= distribution("queue_time", _present(r.metrics.queue_time for r in done))
    if slo is not None:
        out["goodput"] = ratio(sum(1 for r in done if slo.met_by(r)), duration)
    out |= vllm_result_keys(out)
    tags = sorted({r.tag for r in done if r.tag})
    for tag in tags:
        ttfts = _present(r.metrics.ttft for r in done if r.tag == tag)
        out[f"ttft_p50_{tag}"] = percentile(ttfts, 50)
        out[f"ttft_p99_{tag}"] = percentile(ttfts, 99)
    return out


def engine_metrics(trace: RunTrace) -> dict[str, Any]:
    steps, tokens = trace.steps, trace.tokens
    held = sum(s.kv_held_slots for s in steps)
    stored = sum(s.kv_live_tokens for s in steps)
    prefill = sum(t.prefill for t in tokens)
    prefill_pads = sum(t.prefill_pads for t in tokens)
    decode = sum(t.decode for t in tokens)
    decode_pads = sum(t.decode_pads for t in tokens)
    out: dict[str, Any] = {
        "steps": len(steps),
        "kv_utilization": ratio(stored, held),
        "padding_waste": ratio(
            prefill_pads + decode_pads, prefill + prefill_pads + decode + decode_pads
        ),
        "padding_waste_prefill": ratio(prefill_pads, prefill + prefill_pads),
        "padding_waste_decode": ratio(decode_pads, decode + decode_pads),
        "preemptions": sum(s.preempted for s in steps),
        "engine_overhead": overhead(trace),
        "engine_overhead_batch32": overhead(trace, min_seqs=32),
        "step_wall_s": sum(s.wall_s for s in steps),
        "forward_s": sum(s.forward_s for s in steps),
        "mean_batch_size": mean([s.num_seqs for s in steps]),
        "max_batch_size_seen": max((s.num_seqs for s in steps), default=0),
    }
    if trace.leaked_tokens:
        leaked = sum(trace.leaked_tokens)
        out["kv_leaked_share"] = ratio(leaked, held)
        out["kv_utilization_effective"] = ratio(stored - leaked, held)
    if trace.holding:
        out["mean_requests_holding_kv"] = mean(trace.holding)
        out["max_requests_holding_kv"] = max(trace.holding)
    return out


def overhead(trace: RunTrace, min_seqs: int = 0) -> float | None:
    wall = forward = 0.0
    for step, tokens in zip(trace.steps, trace.tokens, strict=False):
        if step.num_seqs >= min_seqs:
            wall += step.wall_s - tokens.instrument_s
            forward += step.forward_s
    return ratio(wall - forward, wall)


def kv_series(trace: RunTrace, max_points: int = 400) -> dict[str, list[float]]:
    """KV utilization per step over the run's time, thinned to at most ``max_points``."""
    stride = max(1, math.ceil(len(trace.steps) / max_points))
    times, util = [], []
    for step in trace.steps[::stride]:
        if step.kv_held_slots:
            times.append(round(step.time - trace.start, 4))
            util.append(round(step.kv_live_tokens / step.kv_held_slots, 4))
    return {"t": times, "kv_utilization": util}


def ttft_values(records: Sequence[RequestRecord]) -> list[float]:
    return sorted(round(v, 5) for v in _present(r.metrics.ttft for r in records))
