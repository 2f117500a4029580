"""Part 2's yardstick and target: device copy bandwidth, the decode launch-config sweep, and
decode at the target shape against ``BANDWIDTH_GOAL`` of the copy bandwidth."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from functools import partial
from typing import Any

import torch

from bench.gpu.kernel_checks import decode_bytes, decode_inputs
from bench.gpu.shapes import BANDWIDTH_GOAL, Shapes
from bench.gpu.timing import bench_ms
from kernels.triton import decode


def copy_bandwidth(s: Shapes, device: torch.device) -> dict[str, Any]:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(s.copy_bytes, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device, max(s.warmup, 1), max(s.iters // 2, 1))
    moved = 2 * s.copy_bytes
    return {"bytes_moved": moved, "ms": ms, "gb_per_s": moved / ms / 1e6}


def sweep_decode(
    s: Shapes, device: torch.device, copy_gbs: float | None, budget_s: float
) -> dict[str, Any]:
    """Launch configs for decode at the target shape; the default config is the first row.
    Configs left when ``budget_s`` runs out are listed as skipped."""
    lens = [s.target_context] * s.decode_batch
    inputs = decode_inputs(s, lens, device)
    scale = 1 / math.sqrt(s.head_dim)
    nbytes = decode_bytes(s, lens)
    default = decode.default_decode_config(s.head_dim)
    configs = [default] + [
        decode.DecodeConfig(tile_n=t, num_warps=w, num_stages=st)
        for t, w, st in s.sweep
        if (t, w, st) != (default.tile_n, default.num_warps, default.num_stages)
    ]
    rows = []
    deadline = time.perf_counter() + budget_s
    for config in configs:
        row: dict[str, Any] = asdict(config)
        if time.perf_counter() > deadline:
            rows.append({**row, "skipped": "time budget"})
            continue
        try:
            run = partial(decode.paged_decode_attention, *inputs, scale, config=config)
            ms = bench_ms(run, device, s.warmup, s.iters)
            row.update(ms=ms, gb_per_s=nbytes / ms / 1e6)
            if copy_gbs:
                row["fraction_of_copy_bw"] = row["gb_per_s"] / copy_gbs
        except Exception as exc:  # a config that fails to compile is data too
            row["error"] = repr(exc)[:500]
        rows.append(row)
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    return {"batch": s.decode_batch, "context": s.target_context, "configs": rows, "best": best}


def target_summary(s: Shapes, decode_rows: list[dict] | None, sweep: dict | None) -> dict:
    """Decode at batch 64 × context 2048 (the GPU shape) against 70% of copy bandwidth."""
    summary: dict[str, Any] = {"goal_fraction_of_copy_bw": BANDWIDTH_GOAL}
    row = next((r for r in decode_rows or [] if r["case"] == f"uniform-{s.target_context}"), None)
    if row and "fraction_of_copy_bw" in row:
        summary["default_config_fraction"] = row["fraction_of_copy_bw"]
        summary["met_with_default_config"] = row["fraction_of_copy_bw"] >= BANDWIDTH_GOAL
    best = (sweep or {}).get("best")
    if best and "fraction_of_copy_bw" in best:
        summary["best_sweep_fraction"] = best["fraction_of_copy_bw"]
        summary["best_sweep_config"] = {k: best[k] for k in ("tile_n", "num_warps", "num_stages")}
    return summary
