"""Engine capacity settings: the caps that policy params live under."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

BLOCK_SIZES = (16, 32, 64)
CPU_KV_CACHE_BYTES = 1 << 30
"""On CPU the pool is sized from this budget, never from all free RAM."""


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What every policy may rely on; policy params default from and stay under these."""

    block_size: int
    num_kv_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int

    def blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)


@dataclass(slots=True)
class EngineConfig:
    model: str
    policy: str = "continuous"
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    memory_reserve: float = 0.10
    enable_prefix_caching: bool = True
    max_waiting: int = 1024
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    gpu_memory_utilization: float = 0.90
    num_threads: int | None = None
    retain_freed_host_memory: bool = True
    """On CPU, keep freed allocations mapped between forwards (see engine.host_memory)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if not 0.0 <= self.memory_reserve <= 0.5:
            raise ValueError(f"memory_reserve must be in [0.0, 0.5], got {self.memory_reserve}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend must be auto, torch or triton, got {self.attention_backend!r}"
            )
