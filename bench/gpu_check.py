"""One-shot GPU check of the Triton paged-KV kernels and the engine; writes one JSON file.

    python bench/gpu_check.py [--out bench/results/gpu_check.json]
    python bench/gpu_check.py --cpu-smoke      # same code paths, tiny shapes, TRITON_INTERPRET=1

Parts, each guarded so one failure is recorded and the rest still runs:
1. correctness of ``write_kv_cache``, decode and prefill against ``kernels.reference`` at the
   Llama-3-8B head layout (32 heads, 8 kv heads, head_dim 128, block_size 16, bfloat16);
2. timing against the torch reference, and decode's effective bandwidth (K/V + query bytes
   read per call / time) against the measured device-to-device copy bandwidth; the target is
   decode at batch 64 × context 2048 reaching 70% of it; a small launch-config sweep too;
3. a short end-to-end burst of the engine on a llama3-8b-shaped random model whose weights are
   made directly in GPU memory (no 16 GB checkpoint on disk). The engine needs pydantic; where
   it is missing, the part is skipped and says so (carry the pydantic, pydantic-core,
   annotated-types and typing-inspection wheels to run it).

Needs only torch and triton for parts 1-2 (the kernels import nothing else of ours). The JSON
is rewritten after every part, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check.json"
BANDWIDTH_GOAL = 0.70
TOTAL_BUDGET_S = 420  # the whole run must end well inside 8 minutes
SWEEP_BUDGET_S = 90


@dataclass(frozen=True, slots=True)
class Shapes:
    """Everything that differs between the GPU run and the CPU smoke run."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    decode_batch: int
    decode_contexts: tuple[int, ...]
    target_context: int
    prefill_prompts: tuple[int, ...]
    prefill_chunks: tuple[tuple[int, int], ...]
    write_tokens: int
    copy_bytes: int
    warmup: int
    iters: int
    sweep: tuple[tuple[int, int, int], ...]
    engine_preset: str
    engine_dtype: str
    engine_prompts: int
    engine_prompt_len: int
    engine_max_tokens: int
    engine_timeout_s: int
    engine_backend: str


GPU = Shapes(
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size=16,
    dtype="bfloat16",
    decode_batch=64,
    decode_contexts=(512, 1024, 2048, 4096, 8192),
    target_context=2048,
    prefill_prompts=(1024, 1024, 512, 2048),
    prefill_chunks=((1536, 512), (3584, 512), (1000, 24), (8000, 192)),
    write_tokens=8192,
    copy_bytes=2 << 30,
    warmup=3,
    iters=20,
    sweep=tuple(
        (tile_n, warps, stages) for tile_n in (32, 64, 128) for warps in (4, 8) for stages in (2, 3)
    ),
    engine_preset="llama3-8b",
    engine_dtype="bfloat16",
    engine_prompts=64,
    engine_prompt_len=512,
    engine_max_tokens=64,
    engine_timeout_s=240,
    engine_backend="auto",
)

CPU_SMOKE = Shapes(
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    block_size=16,
    dtype="bfloat16",
    decode_batch=3,
    decode_contexts=(17, 40),
    target_context=40,
    prefill_prompts=(20,),
    prefill_chunks=((12, 5),),
    write_tokens=24,
    copy_bytes=64 << 20,
    warmup=0,
    iters=1,
    sweep=((32, 4, 2), (64, 4, 3)),
    engine_preset="tiny",
    engine_dtype="float32",
    engine_prompts=3,
    engine_prompt_len=12,
    engine_max_tokens=3,
    engine_timeout_s=240,
    engine_backend="triton",  # the interpreted kernels inside the real engine
)


class Report:
    """The JSON being built; saved after every part."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"errors": {}}
        self.started = time.perf_counter()

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.started, 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)

    def part(self, name: str, fn: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            self.data[name] = fn()
        except Exception as exc:  # a failed part must not stop the others
            self.data["errors"][name] = "".join(traceback.format_exception(exc))[-4000:]
            print(f"[gpu_check] {name} FAILED: {exc!r}", flush=True)
        print(f"[gpu_check] {name} done in {time.perf_counter() - began:.1f}s", flush=True)
        self.save()
        return self.data.get(name)


# --------------------------------------------------------------------------- helpers


def bench_ms(torch, fn: Callable[[], Any], device, warmup: int, iters: int) -> float:
    """Mean milliseconds per call: CUDA events on a GPU, the wall clock elsewhere."""
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


def scattered_tables(torch, lens: list[int], block_size: int, device):
    """Block tables over a pool just big enough, blocks in random order (not adjacent)."""
    needed = [-(-n // block_size) for n in lens]
    width = max(needed)
    num_blocks = sum(needed)
    order = torch.randperm(num_blocks)
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(needed):
        tables[i, :n] = order[used : used + n]
        used += n
    return tables.to(device), num_blocks


def random_cache(torch, num_blocks: int, s: Shapes, device):
    dtype = getattr(torch, s.dtype)
    shape = (num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
    k = torch.randn(shape, device=device, dtype=dtype)
    v = torch.randn(shape, device=device, dtype=dtype)
    return k, v


def max_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


# --------------------------------------------------------------------------- parts


def environment(torch, triton, device, smoke: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_smoke": smoke,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
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


def copy_bandwidth(torch, device, s: Shapes) -> dict[str, Any]:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(s.copy_bytes, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    ms = bench_ms(torch, lambda: dst.copy_(src), device, max(s.warmup, 1), max(s.iters // 2, 1))
    moved = 2 * s.copy_bytes
    return {"bytes_moved": moved, "ms": ms, "gb_per_s": moved / ms / 1e6}


def check_write(torch, device, s: Shapes, ops, reference) -> dict[str, Any]:
    dtype = getattr(torch, s.dtype)
    num_blocks = -(-s.write_tokens // s.block_size) + 8
    k_cache, v_cache = random_cache(torch, num_blocks, s, device)
    kv_shape = (s.write_tokens, s.num_kv_heads, s.head_dim)
    key = torch.randn(kv_shape, device=device, dtype=dtype)
    value = torch.randn(kv_shape, device=device, dtype=dtype)
    slots = torch.randperm(num_blocks * s.block_size)[: s.write_tokens]
    slots[::7] = -1
    slots = slots.to(device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ops.write_kv_cache(key, value, k_cache, v_cache, slots)
    reference.write_kv_cache(key, value, ref_k, ref_v, slots)
    exact = bool(torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v))
    triton_ms = bench_ms(
        torch,
        lambda: ops.write_kv_cache(key, value, k_cache, v_cache, slots),
        device,
        s.warmup,
        s.iters,
    )
    torch_ms = bench_ms(
        torch,
        lambda: reference.write_kv_cache(key, value, ref_k, ref_v, slots),
        device,
        s.warmup,
        s.iters,
    )
    return {
        "tokens": s.write_tokens,
        "exact_match": exact,
        "triton_ms": triton_ms,
        "torch_ms": torch_ms,
    }


def decode_inputs(torch, device, s: Shapes, lens: list[int]):
    dtype = getattr(torch, s.dtype)
    tables, num_blocks = scattered_tables(torch, lens, s.block_size, device)
    k_cache, v_cache = random_cache(torch, num_blocks, s, device)
    query = torch.randn(len(lens), s.num_heads, s.head_dim, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return query.to(dtype), k_cache, v_cache, tables, seq_lens


def decode_bytes(s: Shapes, lens: list[int]) -> int:
    """What a decode call must read: every cached K and V row, plus the queries."""
    itemsize = 2 if s.dtype in ("bfloat16", "float16") else 4
    kv = 2 * sum(lens) * s.num_kv_heads * s.head_dim * itemsize
    return kv + len(lens) * s.num_heads * s.head_dim * itemsize


def check_decode(torch, device, s: Shapes, decode, reference, copy_gbs: float | None):
    scale = 1 / math.sqrt(s.head_dim)
    rows = []
    cases = [(f"uniform-{c}", [c] * s.decode_batch) for c in s.decode_contexts]
    ragged = torch.randint(1, max(s.decode_contexts) + 1, (s.decode_batch,))
    cases.append(("ragged", ragged.tolist()))
    for name, lens in cases:
        inputs = decode_inputs(torch, device, s, lens)
        q, k_cache, v_cache, tables, seq_lens = inputs
        run = partial(decode.paged_decode_attention, *inputs, scale)
        run_ref = partial(reference.decode_attention, *inputs, scale)
        out, ref = run(), run_ref()
        exact = reference.decode_attention(
            q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, scale
        )
        row: dict[str, Any] = {
            "case": name,
            "batch": len(lens),
            "max_context": max(lens),
            "max_abs_err_vs_torch": max_err(out, ref),
            "max_abs_err_vs_fp32": max_err(out, exact),
            "torch_max_abs_err_vs_fp32": max_err(ref, exact),
        }
        del exact
        row["triton_ms"] = bench_ms(torch, run, device, s.warmup, s.iters)
        row["torch_ms"] = bench_ms(torch, run_ref, device, s.warmup, s.iters)
        nbytes = decode_bytes(s, lens)
        row["bytes_read"] = nbytes
        row["triton_gb_per_s"] = nbytes / row["triton_ms"] / 1e6
        row["speedup_vs_torch"] = row["torch_ms"] / row["triton_ms"]
        if copy_gbs:
            row["fraction_of_copy_bw"] = row["triton_gb_per_s"] / copy_gbs
        rows.append(row)
        del inputs, q, k_cache, v_cache, tables, seq_lens, run, run_ref, out, ref
    return rows


def sweep_decode(torch, device, s: Shapes, decode, copy_gbs: float | None, budget_s: float):
    """Launch configs for decode at the target shape; the default config is the first row.
    Configs left when ``budget_s`` runs out are listed as skipped."""
    lens = [s.target_context] * s.decode_batch
    inputs = decode_inputs(torch, device, s, lens)
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
            row["skipped"] = "time budget"
            rows.append(row)
            continue
        try:
            run = partial(decode.paged_decode_attention, *inputs, scale, config=config)
            ms = bench_ms(torch, run, device, s.warmup, s.iters)
            row.update(ms=ms, gb_per_s=nbytes / ms / 1e6)
            if copy_gbs:
                row["fraction_of_copy_bw"] = row["gb_per_s"] / copy_gbs
        except Exception as exc:  # a config that fails to compile is data too
            row["error"] = repr(exc)[:500]
        rows.append(row)
    timed = [r for r in rows if "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    return {"batch": s.decode_batch, "context": s.target_context, "configs": rows, "best": best}


def check_prefill(torch, device, s: Shapes, prefill, reference) -> dict[str, Any]:
    """Whole prompts and chunks extending a cached prefix, packed into one call."""
    dtype = getattr(torch, s.dtype)
    seqs = [(n, n) for n in s.prefill_prompts] + [(c + q, q) for c, q in s.prefill_chunks]
    lens = [n for n, _ in seqs]
    q_lens = [q for _, q in seqs]
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    tables, num_blocks = scattered_tables(torch, lens, s.block_size, device)
    k_cache, v_cache = random_cache(torch, num_blocks, s, device)
    query = torch.randn(starts[-1], s.num_heads, s.head_dim, device=device)
    query = query.to(dtype)
    seq_lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    starts_t = torch.tensor(starts, dtype=torch.int32, device=device)
    scale = 1 / math.sqrt(s.head_dim)

    def run():
        return prefill.paged_prefill_attention(
            query, k_cache, v_cache, tables, seq_lens_t, starts_t, max(q_lens), scale
        )

    def run_ref():
        return reference.prefill_attention(query, k_cache, v_cache, tables, lens, starts, scale)

    out, ref = run(), run_ref()
    exact = reference.prefill_attention(
        query.float(), k_cache.float(), v_cache.float(), tables, lens, starts, scale
    )
    result: dict[str, Any] = {
        "seqs": [{"seq_len": n, "query_len": q} for n, q in seqs],
        "tokens": starts[-1],
        "max_abs_err_vs_torch": max_err(out, ref),
        "max_abs_err_vs_fp32": max_err(out, exact),
        "torch_max_abs_err_vs_fp32": max_err(ref, exact),
    }
    del exact
    result["triton_ms"] = bench_ms(torch, run, device, s.warmup, s.iters)
    result["torch_ms"] = bench_ms(torch, run_ref, device, s.warmup, max(s.iters // 4, 1))
    # Causal attention FLOPs: QK^T and PV, each 2 * head_dim per (query, visible key) pair.
    pairs = sum(q * (n - q) + q * (q + 1) / 2 for n, q in seqs)
    flops = 4 * pairs * s.num_heads * s.head_dim
    result["triton_tflop_per_s"] = flops / result["triton_ms"] / 1e9
    result["speedup_vs_torch"] = result["torch_ms"] / result["triton_ms"]
    return result


# --------------------------------------------------------------------------- engine


class EngineTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """SIGALRM in the main thread: stops a hung engine part between Python bytecodes."""

    def expire(signum, frame):
        raise EngineTimeout(f"engine part exceeded {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def weights_in_memory(checkpoint, loader, preset, device, dtype) -> Iterator[None]:
    """Have the loader take random weights made on ``device`` instead of reading files."""
    original = loader.iter_tensors

    def iter_tensors(path):
        return checkpoint.random_weights(preset, seed=0, dtype=dtype, device=device)

    loader.iter_tensors = iter_tensors
    try:
        yield
    finally:
        loader.iter_tensors = original


def write_model_dir(checkpoint, preset, out: Path) -> None:
    """config.json, generation config and tokenizer: a checkpoint folder minus its weights."""
    tokenizer = checkpoint.build_tokenizer(preset.tokenizer_vocab)
    bos, eos = tokenizer.token_to_id(checkpoint.BOS), tokenizer.token_to_id(checkpoint.EOS)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps(checkpoint.hf_config(preset, bos, eos)))
    generation = {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation))


def run_engine(torch, device, s: Shapes, timeout_s: int) -> dict[str, Any]:
    """A burst through ``LLM.generate`` with the Triton backend (``auto`` on CUDA), then the
    first prompts again with the torch backend to compare greedy tokens."""
    if importlib.util.find_spec("pydantic") is None:
        return {"skipped": "pydantic is not installed; the engine's policies need it"}
    if importlib.util.find_spec("engine.llm") is None:
        return {"skipped": "engine/llm.py is not in this tree yet"}
    from engine import checkpoint
    from engine.llm import LLM
    from engine.model import loader
    from engine.sampling_params import SamplingParams
    from kernels.attention import resolve_backend

    preset = checkpoint.PRESETS[s.engine_preset]
    dtype = getattr(torch, s.engine_dtype)
    prompts = [
        torch.randint(3, preset.tokenizer_vocab, (s.engine_prompt_len,)).tolist()
        for _ in range(s.engine_prompts)
    ]
    burst = SamplingParams(max_tokens=s.engine_max_tokens, temperature=0.0, ignore_eos=True)
    short = SamplingParams(max_tokens=min(16, s.engine_max_tokens), temperature=0.0)
    few = prompts[:8]
    total_tokens = s.engine_prompts * (s.engine_prompt_len + s.engine_max_tokens)
    result: dict[str, Any] = {
        "preset": s.engine_preset,
        "parameters": preset.num_parameters(),
        "attention_backend": resolve_backend(s.engine_backend, device),
    }

    def build(backend: str):
        with weights_in_memory(checkpoint, loader, preset, device, dtype):
            return LLM(
                str(model_dir),
                policy="continuous",
                device=device.type,
                dtype=s.engine_dtype,
                block_size=s.block_size,
                num_kv_blocks=2 * -(-total_tokens // s.block_size) + 64,
                max_model_len=s.engine_prompt_len + s.engine_max_tokens + 16,
                attention_backend=backend,
            )

    def timed_generate(llm, batch, params):
        sync(torch, device)
        began = time.perf_counter()
        outputs = llm.generate(batch, params)
        sync(torch, device)
        return outputs, time.perf_counter() - began

    with tempfile.TemporaryDirectory() as tmp, time_limit(timeout_s):
        model_dir = Path(tmp)
        write_model_dir(checkpoint, preset, model_dir)
        began = time.perf_counter()
        llm = build(s.engine_backend)
        result["load_s"] = time.perf_counter() - began
        result["kv_stats_before"] = _plain(llm.kv_stats())
        llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
        outputs, wall = timed_generate(llm, prompts, burst)
        generated = sum(len(o.token_ids) for o in outputs)
        result.update(
            requests=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            generated_tokens=generated,
            wall_s=wall,
            output_tokens_per_s=generated / wall,
            all_finished=all(len(o.token_ids) == s.engine_max_tokens for o in outputs),
        )
        ttfts = sorted(
            t for o in outputs if (t := getattr(getattr(o, "metrics", None), "ttft", None))
        )
        if ttfts:
            result["ttft_p50_s"] = ttfts[len(ttfts) // 2]
            result["ttft_max_s"] = ttfts[-1]
        if device.type == "cuda":
            result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        default_tokens = [list(o.token_ids) for o in llm.generate(few, short)]
        del llm, outputs
        free_memory(torch, device)
        torch_tokens = [list(o.token_ids) for o in build("torch").generate(few, short)]
    result["greedy_vs_torch_backend"] = agreement(default_tokens, torch_tokens)
    return result


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """How far greedy outputs of two backends agree (bf16 noise may flip a near tie)."""
    prefixes = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
        prefixes.append(min(len(x), len(y)) if same is None else same)
    return {
        "requests": len(a),
        "identical": sum(x == y for x, y in zip(a, b, strict=True)),
        "mean_common_prefix": sum(prefixes) / max(len(prefixes), 1),
        "tokens_per_request": max((len(x) for x in a), default=0),
    }


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(torch, device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return value._asdict()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value if isinstance(value, dict | list | int | float | str) else repr(value)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    sys.path.insert(0, str(ROOT))

    import torch
    import triton

    from kernels import reference
    from kernels.triton import decode, ops, prefill

    shapes = CPU_SMOKE if args.cpu_smoke else GPU
    if args.cpu_smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        parser.error("no CUDA device: run with --cpu-smoke for the CPU code-path check")
    torch.manual_seed(0)
    report = Report(args.out)
    report.data["environment"] = environment(torch, triton, device, args.cpu_smoke)
    report.data["shapes"] = asdict(shapes)
    report.save()

    copy = report.part("copy_bandwidth", lambda: copy_bandwidth(torch, device, shapes))
    copy_gbs = copy["gb_per_s"] if copy else None
    report.part("write_kv_cache", lambda: check_write(torch, device, shapes, ops, reference))
    decode_rows = report.part(
        "decode", lambda: check_decode(torch, device, shapes, decode, reference, copy_gbs)
    )
    sweep = report.part(
        "decode_sweep",
        lambda: sweep_decode(torch, device, shapes, decode, copy_gbs, SWEEP_BUDGET_S),
    )
    report.part("prefill", lambda: check_prefill(torch, device, shapes, prefill, reference))
    report.data["target"] = target_summary(shapes, decode_rows, sweep)
    report.save()
    if args.skip_engine:
        report.data["engine"] = {"skipped": "--skip-engine"}
    else:
        left = int(TOTAL_BUDGET_S - (time.perf_counter() - report.started))
        timeout = max(30, min(shapes.engine_timeout_s, left))
        report.part("engine", lambda: run_engine(torch, device, shapes, timeout))
    report.save()
    print(json.dumps({k: report.data.get(k) for k in ("target", "errors")}, indent=2))
    print(f"[gpu_check] wrote {args.out}")
    return 0


def target_summary(s: Shapes, decode_rows, sweep) -> dict[str, Any]:
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


if __name__ == "__main__":
    raise SystemExit(main())
