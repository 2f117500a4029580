"""Everything that differs between the GPU run and the CPU smoke run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the GPU check imports no engine module before it must
    from engine.config import Dtype
    from kernels.registry import BackendChoice

BANDWIDTH_GOAL = 0.70
"""Decode at the target shape should read K/V at this fraction of the copy bandwidth."""
TOTAL_BUDGET_S = 420
"""The whole run must end well inside 8 minutes."""
SWEEP_BUDGET_S = 90


@dataclass(frozen=True, slots=True)
class Shapes:
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
    """(cached context, new tokens) of chunks extending a cached prefix."""
    write_tokens: int
    copy_bytes: int
    warmup: int
    iters: int
    sweep: tuple[tuple[int, int, int], ...]
    """Decode launch configs: (tile_n, num_warps, num_stages)."""
    engine_preset: str
    engine_dtype: Dtype
    engine_prompts: int
    engine_prompt_len: int
    engine_max_tokens: int
    engine_timeout_s: int
    engine_backend: BackendChoice


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
