"""The tensors the KV block pool indexes: one pool per layer, and what a block of them costs."""

from __future__ import annotations

import torch

from engine.kv_budget import kv_block_bytes


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """One ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` pool per layer.

    Stored head-major (``[2, num_kv_heads, num_blocks, block_size, head_dim]`` underneath):
    a decode batch's blocks of one head then gather into one contiguous buffer, and the
    kernels, which honour strides, read the logical view. Zeroed, not empty: a masked slot
    still enters ``0 × value`` and must not hold NaN.
    """
    shape = (2, num_kv_heads, num_blocks, block_size, head_dim)
    return [
        torch.zeros(shape, dtype=dtype, device=device).permute(0, 2, 3, 1, 4)
        for _ in range(num_layers)
    ]


def kv_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return kv_block_bytes(num_layers, block_size, num_kv_heads, head_dim, element)
