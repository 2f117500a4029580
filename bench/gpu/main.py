"""``python bench/gpu_check.py`` (or ``python -m bench.gpu``): run the parts, write the JSON."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu.report import Report
from bench.gpu.shapes import CPU_SMOKE, GPU, SWEEP_BUDGET_S, TOTAL_BUDGET_S

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="One-shot GPU check of the Triton paged-KV kernels and the engine (docs/gpu.md)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on CPU with TRITON_INTERPRET=1 (checks the script, measures nothing)",
    )
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
    import torch
    import triton

    # Imported only now: they import triton, which reads TRITON_INTERPRET once.
    from bench.gpu.bandwidth import copy_bandwidth, sweep_decode, target_summary
    from bench.gpu.engine_burst import run_engine
    from bench.gpu.kernel_checks import check_decode, check_prefill, check_write

    shapes = CPU_SMOKE if args.cpu_smoke else GPU
    if args.cpu_smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        parser.error("no CUDA device: run with --cpu-smoke for the CPU code-path check")
    torch.manual_seed(0)
    report = Report(args.out)
    report.data["environment"] = environment(torch, triton.__version__, device, args.cpu_smoke)
    report.data["shapes"] = asdict(shapes)
    report.save()

    copy = report.part("copy_bandwidth", lambda: copy_bandwidth(shapes, device))
    copy_gbs = copy["gb_per_s"] if copy else None
    report.part("write_kv_cache", lambda: check_write(shapes, device))
    decode_rows = report.part("decode", lambda: check_decode(shapes, device, copy_gbs))
    sweep = report.part(
        "decode_sweep", lambda: sweep_decode(shapes, device, copy_gbs, SWEEP_BUDGET_S)
    )
    report.part("prefill", lambda: check_prefill(shapes, device))
    report.data["target"] = target_summary(shapes, decode_rows, sweep)
    report.save()
    if args.skip_engine:
        report.data["engine"] = {"skipped": "--skip-engine"}
    else:
        timeout = max(30, min(shapes.engine_timeout_s, int(TOTAL_BUDGET_S - report.elapsed_s)))
        report.part("engine", lambda: run_engine(shapes, device, timeout))
    report.save()
    print(json.dumps({k: report.data.get(k) for k in ("target", "errors")}, indent=2))
    print(f"[gpu_check] wrote {args.out}")
    return 0


def environment(torch: Any, triton_version: str, device: Any, smoke: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_smoke": smoke,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "device": str(device),
        "pydantic": importlib.util.find_spec("pydantic") is not None,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    return info
