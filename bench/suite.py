"""Runs a plan over one loaded model and keeps each run's results.

Ratios are only ever taken between runs of this process.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import workloads as wl
from bench.metrics import engine_metrics, kv_series, request_metrics, ttft_values
from bench.peers import (
    HF_BATCH_TOKENS,
    HF_PAGE_SIZE,
    PeerTrace,
    load_hf_model,
    run_hf_continuous,
    run_hf_static,
    transformers_available,
)
from bench.plan import SEED, PeerSpec, RunSpec, max_batch_of
from bench.presets import Preset
from bench.progress import Progress
from bench.replay import replay
from bench.runner import EngineFactory, EngineSettings, RunTrace, SkipClock, drive
from bench.workloads import Workload


@dataclass
class BenchOutput:
    runs: list[dict[str, Any]]
    series: dict[str, dict[str, Any]]
    skipped: list[str]
    saturation_rate: float | None
    interrupted: bool = False


class Bench:
    def __init__(
        self,
        preset: Preset,
        factory: EngineFactory,
        plan: list[RunSpec | PeerSpec],
        device: str = "cpu",
        dtype: str = "float32",
        label: str = "bench",
    ) -> None:
        self.preset = preset
        self.factory = factory
        self.plan = plan
        self.device = device
        self.dtype = dtype
        self.out = BenchOutput([], {}, [], None)
        self.outputs: dict[str, dict[int, list[int]]] = {}
        total = sum(len(s.workload.requests) * s.units_per_request for s in plan)
        self.progress = Progress(total, label)
        self._hf_model: Any = None

    def run(self) -> BenchOutput:
        """Every run of the plan in order; Ctrl-C keeps what was measured so far."""
        self._warm_up()
        try:
            for i, spec in enumerate(self.plan, start=1):
                self.progress.start_run(spec.id, i, len(self.plan), spec.units_per_request)
                result = (
                    self._run_peer(spec) if isinstance(spec, PeerSpec) else self._run_engine(spec)
                )
                if result is not None:
                    self.out.runs.append(result)
                    self.progress.finish_run(_summary(result))
                gc.collect()
        except KeyboardInterrupt:
            self.out.interrupted = True
            self.out.skipped.append(f"interrupted after {len(self.out.runs)} runs")
        self.progress.close()
        self._hf_model = None
        return self.out

    def _warm_up(self) -> None:
        """First forwards pay one-off costs (allocator, kernels); keep them out of run one."""
        workload = wl.burst(4, False, self.preset.scale, self.factory.vocab_size, SEED + 1)
        engine, recorder = self.factory.build(EngineSettings("continuous"), SkipClock())
        drive(engine, recorder, workload)

    def _run_engine(self, spec: RunSpec) -> dict[str, Any] | None:
        workload = spec.workload
        if spec.rate_fraction is not None:
            if not self.out.saturation_rate:
                self.out.skipped.append(f"{spec.id}: no saturation rate measured")
                self.progress.advance(len(workload.requests))
                return None
            rate = spec.rate_fraction * self.out.saturation_rate
            workload = workload.with_poisson_arrivals(rate, SEED)
        clock = SkipClock()
        engine, recorder = self.factory.build(spec.settings, clock, keep_shapes=spec.replay)
        trace = drive(
            engine,
            recorder,
            workload,
            spec.hooks,
            self.progress.advance,
            self.factory.kv_bytes_per_token(),
        )
        result = self._result(spec, workload, trace)
        result |= decode_gather_stats(recorder.inner)
        if spec.replay and trace.shapes:
            bound = replay(recorder.inner, trace.shapes)  # type: ignore[arg-type]  # a ModelRunner here; LLMEngine.runner is typed as the Runner seam
            busy = trace.end - trace.start - trace.idle_skipped_s
            result["replay_bound_s"] = bound.forward_s
            result["replay_efficiency"] = bound.forward_s / busy if busy > 0 else None
            # below 1 - overhead: the run's own forwards were slower than the same shapes alone
            result["replay_forward_ratio"] = bound.forward_s / result["forward_s"]
            result["replay_output_throughput"] = (
                result["output_tokens"] / bound.forward_s if bound.forward_s else None
            )
        if self._measures_saturation(spec):
            self.out.saturation_rate = result["request_throughput"]
        if spec.keep_series:
            self.out.series[result["id"]] = {
                **kv_series(trace),
                "ttft": ttft_values(trace.requests),
            }
        if spec.suite == "mixed":
            self.outputs[spec.policy] = trace.outputs
        del engine, recorder
        return result

    def _measures_saturation(self, spec: RunSpec) -> bool:
        """Continuous on the variable-output burst at the base size (or its probe)."""
        w = spec.workload
        base = w.name == "burst-variable" and w.concurrency == self.preset.base_concurrency
        return base and spec.policy == "continuous" and spec.suite in ("burst", "probe")

    def _result(self, spec: RunSpec, workload: Workload, trace: RunTrace) -> dict[str, Any]:
        config = spec.settings.config()
        duration = trace.end - trace.start
        result: dict[str, Any] = {
            "id": spec.id,
            "suite": spec.suite,
            "policy": spec.policy,
            "workload": workload.name,
            "concurrency": workload.concurrency,
            "num_requests": len(workload.requests),
            "sweep": spec.labels.get("sweep"),
            "max_batch_size": max_batch_of(spec.settings),
            "block_size": config.block_size,
            "memory_reserve": config.memory_reserve,
            "kv_pool_tokens": (config.num_kv_blocks or 0) * config.block_size,
            "rate": workload.rate,
            "load": spec.rate_fraction,
            "repeat": spec.labels.get("rep"),
            "closed_loop_clients": workload.clients,
            "refused": trace.refused,
            "leaked": trace.leaked,
            "stalled": trace.stalled,
            "idle_skipped_s": trace.idle_skipped_s,
        }
        result |= request_metrics(trace.requests, duration, self.preset.slo)
        result |= engine_metrics(trace)
        if trace.reclaims:
            swept = sum(r.duration_s for _, r in trace.reclaims)
            result["reclaims"] = len(trace.reclaims)
            result["reclaim_s"] = swept
            result["reclaim_cpu_share"] = swept / duration if duration else None
            result["reclaimed_blocks"] = sum(r.freed for _, r in trace.reclaims)
        if spec.hooks.reclaim_every_s is not None:
            result["reclaim_every_s"] = spec.hooks.reclaim_every_s
        if trace.bookkeeping_bytes:
            result["bookkeeping_bytes"] = trace.bookkeeping_bytes
            result["kv_bytes_held_at_peak"] = trace.kv_bytes_at_peak
        return result

    def _run_peer(self, spec: PeerSpec) -> dict[str, Any] | None:
        if not transformers_available():
            self._skip(spec, "transformers is not installed (pip install 'servedeck[bench]')")
            return None
        if spec.peer == "hf-continuous" and not spec.workload.fixed_output:
            self._skip(spec, "generate_batch takes one max_new_tokens; workload varies it")
            return None
        if self._hf_model is None:
            self._hf_model = load_hf_model(self.factory.model_dir, self.device, self.dtype)
            self._warm_up_peer()
        if spec.peer == "hf-static":
            trace = run_hf_static(
                self._hf_model, spec.workload, self.preset.peer_batch, self.progress.advance
            )
        else:
            trace = run_hf_continuous(
                self._hf_model, spec.workload, HF_PAGE_SIZE, HF_BATCH_TOKENS, self.progress.advance
            )
        return self._peer_result(spec, trace)

    def _warm_up_peer(self) -> None:
        workload = wl.burst(2, False, self.preset.scale, self.factory.vocab_size, SEED + 1)
        short = Workload(workload.name, tuple(replace(r, max_tokens=2) for r in workload.requests))
        run_hf_static(self._hf_model, short, 2, lambda n: None)

    def _peer_result(self, spec: PeerSpec, trace: PeerTrace) -> dict[str, Any]:
        workload = spec.workload
        duration = trace.end - trace.start
        result: dict[str, Any] = {
            "id": spec.id,
            "suite": "peers",
            "policy": spec.peer,
            "workload": workload.name,
            "concurrency": workload.concurrency,
            "num_requests": len(workload.requests),
            "sweep": None,
            "max_batch_size": self.preset.peer_batch if spec.peer == "hf-static" else None,
            "block_size": None,
            "rate": None,
            "refused": 0,
            "preemptions": None,
            "engine_overhead": None,
            "kv_utilization": None,
            "padding_waste": None,
        }
        result |= request_metrics(trace.requests, duration, self.preset.slo)
        result |= trace.extra
        reference = self.outputs.get("continuous")
        if reference:
            same = sum(1 for i, toks in trace.outputs.items() if reference.get(i) == toks)
            result["outputs_equal_to_continuous"] = same / len(trace.outputs)
        self.out.series[spec.id] = {"ttft": ttft_values(trace.requests)}
        return result

    def _skip(self, spec: PeerSpec, why: str) -> None:
        message = f"{spec.id} skipped: {why}"
        self.out.skipped.append(message)
        self.progress.advance(len(spec.workload.requests))
        self.progress.finish_run(f"skipped: {why}")


def _summary(result: dict[str, Any]) -> str:
    def fmt(key: str, scale: float = 1.0, unit: str = "") -> str:
        value = result.get(key)
        return "n/a" if value is None else f"{value * scale:.3g}{unit}"

    return (
        f"{fmt('output_throughput')} out tok/s, TTFT p50 {fmt('ttft_p50', 1000, ' ms')}, "
        f"p99 {fmt('ttft_p99', 1000, ' ms')}, {fmt('duration_s', 1, ' s')}"
    )


def decode_gather_stats(runner: Any) -> dict[str, Any]:
    """The torch backend's decode re-gathers (every row's K/V copied afresh) and row copies,
    per run (``kernels.decode_gather``); nothing for another backend."""
    gathers = getattr(getattr(runner, "attention", None), "gathers", None)
    if gathers is None:
        return {}
    stats = gathers.stats()
    steps = stats["decode_steps"]
    return {
        "decode_steps": steps,
        "decode_full_gathers": stats["full_gathers"],
        "decode_row_copies": stats["row_copies"],
        "decode_regrows": stats["regrows"],
        "regathers_per_100_decode_steps": 100 * stats["full_gathers"] / steps if steps else None,
    }


def model_path(preset: Preset, model: str | None) -> Path:
    from engine.checkpoint import default_model_dir

    return Path(model) if model else default_model_dir(preset.model_preset)
