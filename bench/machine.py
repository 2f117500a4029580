"""What the numbers were measured on, and how busy the machine was: absolute times only hold
for this machine, and a busy one (load average above its cores) makes them noisy."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from typing import Any

import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def matmul_gflops(size: int = 512, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best of a few ``[size, 4·size] @ [4·size, size]`` products in ``dtype``: a quick speed
    probe (bfloat16 products run at about twice the float32 rate on AVX-512 BF16)."""
    a = torch.randn(size, 4 * size).to(dtype)
    b = torch.randn(4 * size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size * 4 * size * size / best / 1e9


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe(threads: int, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch_threads": threads,
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "device": device,
        "load_average_start": load_average(),
        "matmul_gflops_start": round(matmul_gflops(), 1),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def finish(info: dict[str, Any], wall_s: float) -> dict[str, Any]:
    info["load_average_end"] = load_average()
    info["matmul_gflops_end"] = round(matmul_gflops(), 1)
    info["bench_wall_s"] = round(wall_s, 1)
    return info
