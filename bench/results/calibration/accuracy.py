"""Calibrated predictions against measured runs on this machine (issue 13's accuracy goal).

For each workload and policy: three measured runs of the real engine (``bench.runner.drive``,
the bench's own driver, model forward included), interleaved (round after round over every
workload and policy), and one simulated run of the same requests with the calibrated model.
Writes ``accuracy.json`` beside this file. Run from the repository root:

    .venv/bin/python bench/results/calibration/accuracy.py [--calibration FILE] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.metrics import request_metrics
from bench.runner import EngineFactory, EngineSettings, RequestRecord, SkipClock, drive
from bench.workloads import Span, Workload, uniform
from engine.checkpoint import default_model_dir
from sim.calibrated import CalibratedModel
from sim.simulator import SimSetup, simulate
from sim.trace import TraceRequest

HERE = Path(__file__).parent
POLICIES = ("continuous", "dynamic", "static", "hybrid")
KV_TOKENS = 32768


def workloads(vocab: int) -> list[Workload]:
    """The bench ``cpu`` preset's burst lengths (input 36-143, output 14), a mixed burst and
    Poisson streams of 16 such requests: 1 request/s (light) and 10 requests/s (near this
    machine's capacity when it is quiet: a 16-request burst takes ~0.8 s)."""
    burst = uniform("burst-16", 16, Span(36, 143), Span(14, 14), vocab, 1)
    mixed = uniform("mixed-12", 12, Span(32, 256), Span(8, 32), vocab, 2)
    stream = uniform("p", 16, Span(36, 143), Span(14, 14), vocab, 3)
    light, heavy = stream.with_poisson_arrivals(1.0, 3), stream.with_poisson_arrivals(10.0, 3)
    return [burst, mixed, replace(light, name="poisson-1"), replace(heavy, name="poisson-10")]


def trace_of(workload: Workload) -> list[TraceRequest]:
    return [TraceRequest(r.arrival, len(r.prompt), r.max_tokens) for r in workload.requests]


def key_figures(records: list[RequestRecord], duration: float) -> dict[str, float | None]:
    m = request_metrics(records, duration, None)
    return {k: m[k] for k in ("output_throughput", "ttft_p50", "tpot_p50", "completed")}


def measured(factory: EngineFactory, workload: Workload, policy: str) -> dict:
    engine, recorder = factory.build(EngineSettings(policy, kv_tokens=KV_TOKENS), SkipClock())
    trace = drive(engine, recorder, workload)
    return key_figures(trace.requests, trace.end - trace.start)


def predicted(model: CalibratedModel, workload: Workload, policy: str) -> dict:
    setup = SimSetup(num_kv_blocks=KV_TOKENS // 16)
    result = simulate(trace_of(workload), model, policy, setup)
    records = [RequestRecord(r.index, "", r.prompt_tokens, r.metrics) for r in result.records]
    return key_figures(records, result.duration_s)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calibration", default=str(HERE / "small-cpu.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = CalibratedModel.load(args.calibration)
    factory = EngineFactory(default_model_dir("small"))
    loads = workloads(factory.vocab_size)
    policies = args.policies.split(",")
    warm = uniform("warm", 4, Span(36, 143), Span(4, 4), factory.vocab_size, 9)
    measured(factory, warm, "continuous")
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for w in loads:
            for p in policies:
                started = time.perf_counter()
                runs.setdefault(f"{w.name}/{p}", []).append(measured(factory, w, p))
                print(
                    f"round {r + 1} {w.name}/{p}: {time.perf_counter() - started:.1f} s", flush=True
                )
    rows = []
    for w in loads:
        for p in policies:
            got = runs[f"{w.name}/{p}"]
            pred = predicted(model, w, p)
            row = {"workload": w.name, "policy": p, "predicted": pred, "measured": got}
            for k in ("output_throughput", "ttft_p50", "tpot_p50"):
                values = [g[k] for g in got if g[k] is not None]
                med = statistics.median(values) if values else None
                row[f"{k}_measured_median"] = med
                row[f"{k}_measured_spread"] = (max(values) - min(values)) / med if med else None
                row[f"{k}_error"] = pred[k] / med - 1 if med and pred[k] is not None else None
            rows.append(row)
            print(
                f"{w.name}/{p}: tok/s pred {pred['output_throughput']:.1f} meas "
                f"{row['output_throughput_measured_median']:.1f} "
                f"({row['output_throughput_error']:+.0%}), TTFT p50 pred "
                f"{pred['ttft_p50'] * 1e3:.0f} ms meas "
                f"{row['ttft_p50_measured_median'] * 1e3:.0f} ms ({row['ttft_p50_error']:+.0%}); "
                f"spread tok/s {row['output_throughput_measured_spread']:.0%} "
                f"TTFT {row['ttft_p50_measured_spread']:.0%}",
                flush=True,
            )
    out = {"calibration": args.calibration, "rounds": args.rounds, "rows": rows}
    (HERE / "accuracy.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
