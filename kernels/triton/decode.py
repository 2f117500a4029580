"""Paged decode attention: one query token per sequence, online softmax over its blocks.

One program per (sequence, kv head) handles every query head of that kv head's GQA group at
once, so each key/value tile is read from memory once. The group is padded to 16 rows because
``tl.dot`` needs at least 16 on a GPU; the extra rows are masked and never stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """Launch parameters; ``tile_n`` tokens (any number of cache blocks) per loop step."""

    tile_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


def default_decode_config(head_dim: int) -> DecodeConfig:
    return DecodeConfig(tile_n=64 if head_dim <= 128 else 32)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt_seq,
    stride_bt_blk,
    stride_ob,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    heads = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    io_mask = row_ok[:, None] & dim_ok[None, :]

    q_offs = seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptr + q_offs, mask=io_mask, other=0.0).to(tl.float32)
    seq_len = tl.load(seq_lens_ptr + seq)
    table = block_tables_ptr + seq * stride_bt_seq

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for start in range(0, seq_len, TILE_N):
        tokens = start + tl.arange(0, TILE_N)
        tok_ok = tokens < seq_len
        # int64 before multiplying by the block stride: int32 wraps silently on big pools.
        blocks = tl.load(table + (tokens // BLOCK_SIZE) * stride_bt_blk, mask=tok_ok, other=0)
        blocks = blocks.to(tl.int64)
        slots = tokens % BLOCK_SIZE
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k_offs = (
            blocks[:, None] * stride_kb
            + slots[:, None] * stride_ks
            + kv_head * stride_kh
            + dims[None, :] * stride_kd
        )
        v_offs = (
            blocks[:, None] * stride_vb
            + slots[:, None] * stride_vs
            + kv_head * stride_vh
            + dims[None, :] * stride_vd
        )
        k = tl.load(k_cache_ptr + k_offs, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + v_offs, mask=kv_mask, other=0.0).to(tl.float32)

        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        scores = tl.where(tok_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new

    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_i[:, None]
    o_offs = seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def dot_precision(cache_dtype: torch.dtype) -> str:
    """Half-precision values are exact in tf32; float32 caches need full-precision products."""
    return "ieee" if cache_dtype == torch.float32 else "tf32"


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """``query`` ``[B, heads, head_dim]`` -> ``[B, heads, head_dim]`` in the query's dtype."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads is not a multiple of {num_kv_heads} kv heads")
    out = torch.empty_like(query)
    if batch == 0:
        return out
    config = config or default_decode_config(head_dim)
    group = num_heads // num_kv_heads
    _decode_kernel[(batch, num_kv_heads)](
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        scale * LOG2E,
        *query.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        TILE_N=config.tile_n,
        PRECISION=dot_precision(k_cache.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
