"""Timing that is honest on both devices: CUDA events on a GPU, the wall clock elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def bench_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Mean milliseconds per call."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    began = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - began) * 1e3 / iters


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
