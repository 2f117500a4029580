"""Store this step's keys and values into the paged cache at their slot indices."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_vc_dim,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    # A slot of -1 is a padding row: computed, never stored.
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    mask = (heads[:, None] < NUM_HEADS) & (dims[None, :] < HEAD_DIM)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    src_k = key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :] * stride_kd
    src_v = value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :] * stride_vd
    dst_k = (
        k_cache_ptr
        + block * stride_kc_block
        + offset * stride_kc_slot
        + heads[:, None] * stride_kc_head
        + dims[None, :] * stride_kc_dim
    )
    dst_v = (
        v_cache_ptr
        + block * stride_vc_block
        + offset * stride_vc_slot
        + heads[:, None] * stride_vc_head
        + dims[None, :] * stride_vc_dim
    )
    k = tl.load(src_k, mask=mask, other=0.0)
    v = tl.load(src_v, mask=mask, other=0.0)
    tl.store(dst_k, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[T, kv_heads, head_dim]`` at flat slots; -1 is skipped."""
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        HEADS_PAD=triton.next_power_of_2(num_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
        num_warps=4,
    )
