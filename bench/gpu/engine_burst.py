"""Part 3: a short burst through the real engine on a random-weight model of the preset's
shape, built in device memory by ``load_bundle(..., RandomWeights(preset))``; then the first
prompts again with the torch attention backend around the same weights, to compare greedy
tokens. Needs pydantic (the policies' params); without it the part says it was skipped."""

from __future__ import annotations

import gc
import importlib.util
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

import torch

from bench.gpu.shapes import Shapes
from bench.gpu.timing import sync

if TYPE_CHECKING:
    from engine.outputs import RequestOutput
    from engine.sampling_params import SamplingParams
    from kernels.registry import BackendChoice
    from serving.engine import LLMEngine


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


def run_engine(s: Shapes, device: torch.device, timeout_s: int) -> dict[str, Any]:
    if importlib.util.find_spec("pydantic") is None:
        return {"skipped": "pydantic is not installed; the engine's policies need it"}
    from engine.builder import load_bundle
    from engine.checkpoint import PRESETS
    from engine.checkpoint_parts import RandomWeights
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams
    from engine.stats import percentile
    from kernels.registry import resolve_backend
    from serving.engine import LLMEngine

    preset = PRESETS[s.engine_preset]
    prompts = [
        torch.randint(3, preset.tokenizer_vocab, (s.engine_prompt_len,)).tolist()
        for _ in range(s.engine_prompts)
    ]
    burst = SamplingParams(max_tokens=s.engine_max_tokens, temperature=0.0, ignore_eos=True)
    short = SamplingParams(max_tokens=min(16, s.engine_max_tokens), temperature=0.0)
    few = prompts[:8]
    total_tokens = s.engine_prompts * (s.engine_prompt_len + s.engine_max_tokens)

    def config(backend: BackendChoice) -> EngineConfig:
        return EngineConfig(
            model=f"random:{s.engine_preset}",  # a label: the weights come from RandomWeights
            policy="continuous",
            device=device.type,
            dtype=s.engine_dtype,
            block_size=s.block_size,
            num_kv_blocks=2 * -(-total_tokens // s.block_size) + 64,
            max_model_len=s.engine_prompt_len + s.engine_max_tokens + 16,
            attention_backend=backend,
        )

    result: dict[str, Any] = {
        "preset": s.engine_preset,
        "parameters": preset.num_parameters(),
        "attention_backend": resolve_backend(s.engine_backend, device),
    }
    with time_limit(timeout_s):
        began = time.perf_counter()
        bundle = load_bundle(config(s.engine_backend), RandomWeights(s.engine_preset, seed=0))
        engine = LLMEngine.from_config(config(s.engine_backend), bundle=bundle)
        result["load_s"] = time.perf_counter() - began
        result["kv_stats_before"] = _plain(engine.kv_stats())
        generate(engine, prompts[:2], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
        sync(device)
        began = time.perf_counter()
        outputs = generate(engine, prompts, burst)
        sync(device)
        wall = time.perf_counter() - began
        generated = sum(len(o.token_ids) for o in outputs)
        ttfts = [t for o in outputs if (t := o.metrics.ttft) is not None]
        result.update(
            requests=len(prompts),
            prompt_tokens=sum(len(p) for p in prompts),
            generated_tokens=generated,
            wall_s=wall,
            output_tokens_per_s=generated / wall,
            all_finished=all(len(o.token_ids) == s.engine_max_tokens for o in outputs),
            ttft_p50_s=percentile(ttfts, 50),
            ttft_max_s=max(ttfts, default=None),
        )
        if device.type == "cuda":
            result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        default_tokens = [o.token_ids for o in generate(engine, few, short)]
        del engine, outputs
        _free_memory(device)
        reference = LLMEngine.from_config(config("torch"), bundle=bundle)
        torch_tokens = [o.token_ids for o in generate(reference, few, short)]
    result["greedy_vs_torch_backend"] = agreement(default_tokens, torch_tokens)
    return result


def generate(
    engine: LLMEngine, prompts: Sequence[list[int]], params: SamplingParams
) -> list[RequestOutput]:
    """Every prompt at once, stepped to the end; the final outputs in prompt order."""
    ids = [engine.add_request(list(prompt), params) for prompt in prompts]
    final: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        final |= {out.request_id: out for out in engine.step() if out.finished}
    return [final[i] for i in ids]


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


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _plain(value: Any) -> Any:
    """JSON-ready: pydantic models and dataclasses become dicts."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value
