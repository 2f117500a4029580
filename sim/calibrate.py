"""``servedeck calibrate``: time this engine's real ModelRunner over a grid of step shapes and
fit a ``CalibratedModel`` (sim/calibrated.py) to the medians.

Each grid point is one step built by hand (sequences with block tables over a private KV
pool, no policy, no BlockManager) and run through ``ModelRunner.execute``: the same packing,
forward and sampling the engine runs. The timed span is ``execute`` as the engine calls it, so
the fit predicts the runner's part of a step; the engine's own part around it (policy, block
manager, outputs) is measured apart on a real ``LLMEngine`` (``engine_overhead``). Repeats go
round the whole grid, point after point, so a slow spell of this shared machine spreads over
every point instead of one.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.batch import ScheduledBatch, ScheduledSeq, StepResult
from engine.builder import ModelBundle, build_runner, load_bundle
from engine.config import CPU_KV_CACHE_BYTES, EngineConfig
from engine.cpu import BF16_FLAGS, cpu_features
from engine.kv_pool import kv_bytes_per_block
from engine.runner import ModelRunner, Runner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from serving.engine import LLMEngine
from sim.calibrated import FEATURES, FORMAT, fit, nnls
from sim.calibrations import cpu_kind
from sim.cost_model import StepShape
from sim.fingerprint import HASH_OF, model_hash

FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "amx_tile", *BF16_FLAGS)
"""The CPU flags a calibration records (the kernels' speed turns on them)."""


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One step: prefill chunks ``(new tokens, cached context)`` and decode rows (context)."""

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    @property
    def shape(self) -> StepShape:
        return StepShape(
            tuple(t for t, _ in self.prefill), tuple(c for _, c in self.prefill), self.decode
        )

    @property
    def num_slots(self) -> int:
        return sum(t + c for t, c in self.prefill) + sum(self.decode)


def _grid(prefill: list[int], contexts: list[int], rows: list[int], decode_ctx: list[int],
          mixed: list[GridPoint]) -> tuple[GridPoint, ...]:  # fmt: skip
    points = [GridPoint(prefill=((t, c),)) for t in prefill for c in contexts]
    points += [GridPoint(decode=(c,) * n) for n in rows for c in decode_ctx]
    return tuple(points + mixed)


QUICK_GRID = _grid(
    [16, 64, 160],
    [0, 96],
    [1, 4, 12],
    [32, 160],
    [GridPoint(((48, 0),), (64,) * 4), GridPoint(((32, 0), (32, 32)), (96,) * 2)],
)
"""Seconds on the tiny model: for tests."""

DEFAULT_GRID = _grid(
    [32, 128, 512],
    [0, 512],
    [1, 8, 32, 96],
    [64, 512],
    [
        GridPoint(((128, 0),) * 16),
        GridPoint(((64, 0),) * 8, (128,) * 8),
        GridPoint(((256, 0),), (256,) * 16),
        GridPoint(((512, 512),), (512,) * 4),
        GridPoint(((64, 128),), (128,) * 48),
    ],
)
"""The grid a plain ``servedeck calibrate`` times (a few minutes for ``small`` on 2 cores):
the bench ``cpu`` preset's shapes (short prompts, up to 2,048-token multi-chunk prefills,
decode batches to 96 rows) and longer contexts."""


class StepBench:
    """Builds each grid point's batch over a private KV pool and times ``execute``."""

    def __init__(self, runner: ModelRunner, block_size: int, vocab_size: int) -> None:
        self.runner = runner
        self.block_size = block_size
        self.vocab_size = vocab_size
        self._params = SamplingParams(max_tokens=1, temperature=0.0)

    def _seq(self, index: int, num_tokens: int, computed: int, first_block: int) -> Sequence:
        ids = [(7 * index + 13 * i) % (self.vocab_size - 1) + 1 for i in range(num_tokens)]
        seq = Sequence(f"cal-{index}", ids, self._params, arrival_time=0.0)
        seq.num_computed_tokens = computed
        num_blocks = -(-num_tokens // self.block_size)
        seq.block_table = list(range(first_block, first_block + num_blocks))
        return seq

    def batch(self, point: GridPoint) -> ScheduledBatch:
        entries: list[ScheduledSeq] = []
        block = 0
        for new, cached in point.prefill:
            seq = self._seq(len(entries), cached + new, cached, block)
            block += len(seq.block_table)
            entries.append(ScheduledSeq(seq, new))
        for context in point.decode:
            seq = self._seq(len(entries), context, context - 1, block)
            block += len(seq.block_table)
            entries.append(ScheduledSeq(seq, 1))
        return ScheduledBatch(entries)

    def time(self, point: GridPoint) -> float:
        batch = self.batch(point)
        started = time.perf_counter()
        self.runner.execute(batch)
        return time.perf_counter() - started


def measure(
    bench: StepBench,
    grid: tuple[GridPoint, ...],
    repeats: int,
    progress: Callable[[str], None] | None = None,
) -> list[list[float]]:
    """``repeats`` timings per point, taken round after round over the grid (one untimed
    warm-up round first)."""
    for point in grid:
        bench.time(point)
    samples: list[list[float]] = [[] for _ in grid]
    for r in range(repeats):
        for i, point in enumerate(grid):
            samples[i].append(bench.time(point))
        if progress:
            progress(f"round {r + 1}/{repeats} done")
    return samples


class _TimedRunner:
    """The engine's runner, timing each ``execute`` and noting its batch size."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.last_forward_s = 0.0
        self.calls: list[tuple[float, int]] = []

    def execute(self, batch: ScheduledBatch) -> StepResult:
        started = time.perf_counter()
        result = self.inner.execute(batch)
        self.calls.append((time.perf_counter() - started, batch.num_seqs))
        self.last_forward_s = self.inner.last_forward_s
        return result


def engine_overhead(
    bundle: ModelBundle, config: EngineConfig, num_requests: int = 48, prompt_len: int = 32
) -> dict[str, float]:
    """What ``LLMEngine.step`` adds around ``execute`` (policy, block manager, outputs):
    per step and per sequence, fitted over a continuous burst whose requests finish one
    after another (outputs of 4 to 27 tokens), so the batch shrinks step by step."""
    blocks = num_requests * -(-(prompt_len + 32) // config.block_size) + 16
    engine = LLMEngine.from_config(replace(config, num_kv_blocks=blocks), bundle=bundle)
    runner = _TimedRunner(engine.runner)
    engine.runner = runner
    vocab = bundle.config.vocab_size
    for i in range(num_requests):
        params = SamplingParams(max_tokens=4 + i % 24, temperature=0.0, ignore_eos=True)
        engine.add_request([(31 * i + j) % (vocab - 1) + 1 for j in range(prompt_len)], params)
    rows: list[tuple[float, float]] = []
    extra: list[float] = []
    while engine.has_unfinished_requests():
        calls = len(runner.calls)
        started = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - started
        if len(runner.calls) > calls:
            execute_s, seqs = runner.calls[-1]
            rows.append((1.0, float(seqs)))
            extra.append(max(wall - execute_s, 0.0))
    per_step, per_seq = nnls(np.asarray(rows), np.asarray(extra))
    return {"per_step_s": float(per_step), "per_seq_s": float(per_seq), "steps": len(rows)}


def calibrate(
    config: EngineConfig,
    grid: tuple[GridPoint, ...] = DEFAULT_GRID,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time ``grid`` on the model ``config.model`` and return the calibration file's data."""
    bundle = load_bundle(config)
    mc = bundle.config
    dtype = getattr(torch, config.weights_dtype)
    per_block = kv_bytes_per_block(
        mc.num_hidden_layers, config.block_size, mc.num_key_value_heads, mc.head_dim, dtype
    )
    needed = max(-(-p.num_slots // config.block_size) + len(p.shape.decode_context) +
                 len(p.prefill) for p in grid)  # fmt: skip
    runner, _ = build_runner(bundle, replace(config, num_kv_blocks=needed))
    kv_bytes = CPU_KV_CACHE_BYTES
    if config.device.startswith("cuda"):  # size the pool as the engine would, then record it
        del runner
        runner, limits = build_runner(bundle, replace(config, num_kv_blocks=None))
        kv_bytes = limits.num_kv_blocks * per_block
    features = cpu_features()
    bench = StepBench(runner, config.block_size, mc.vocab_size)
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    samples = measure(bench, grid, repeats, progress)
    medians = [statistics.median(s) for s in samples]
    result = fit([p.shape for p in grid], medians)
    overhead = engine_overhead(bundle, config)
    model = {"num_parameters": sum(p.numel() for p in bundle.model.parameters())}
    model |= {k: getattr(mc, k) for k in ("num_hidden_layers", "hidden_size", "vocab_size")}
    compute = runner.compute
    attention = compute.attention if compute is not None else "torch"
    return {
        "format": FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "servedeck": _version(),
        "model": {
            "path": str(config.model),
            "hash": model_hash(config.model),
            "hash_of": HASH_OF,
            **model,
        },
        "machine": {
            "device": config.device,
            "dtype": config.weights_dtype,
            "attention": attention,
            "attention_reason": compute.attention_reason if compute is not None else "",
            "cpu": cpu_kind(config.device),
            "cpu_model": features.model,
            "cpu_capability": features.capability,
            "cpu_flags": sorted(f for f in features.flags if f in FLAGS_THAT_MATTER),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "block_size": config.block_size,
        "kv_cache": {"bytes": kv_bytes, "bytes_per_token": per_block // config.block_size},
        "repeats": repeats,
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "measure_s": round(time.perf_counter() - started, 2),
        "fit": {
            "features": list(FEATURES),
            "coefficients": result.coefficients,
            "mean_abs_rel_error": result.mean_abs_rel_error,
            "max_abs_rel_error": result.max_abs_rel_error,
        },
        "engine_overhead": overhead,
        "grid": [
            {**asdict(p.shape), "median_s": m, "min_s": min(s), "samples_s": s}
            for p, m, s in zip(grid, medians, samples, strict=True)
        ],
    }


def _version() -> str:
    try:
        return importlib.metadata.version("servedeck")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write(path: str | Path, data: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
