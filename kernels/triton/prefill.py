"""Chunked prefill / extend attention over the paged cache.

A program takes ``BLOCK_Q`` query tokens of one sequence and every query head of one kv head
(rows are ``token * GROUP_PAD + head``), so each key/value tile serves the whole GQA group.
The chunk's own keys were written to the cache before this runs, so cached prefix and new
tokens are read the same way, through the block table, with a causal mask on positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton.decode import LOG2E, dot_precision


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    """Launch parameters; ``block_m`` rows (query tokens × padded group) per program."""

    block_m: int = 64
    tile_n: int = 32
    num_warps: int = 4
    num_stages: int = 2


def default_prefill_config(head_dim: int) -> PrefillConfig:
    return PrefillConfig(num_warps=4 if head_dim <= 64 else 8)


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    out_ptr,
    scale_log2,
    stride_qt,
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
    stride_ot,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_ptr + seq).to(tl.int64)
    q_len = (tl.load(query_start_ptr + seq + 1) - q_start).to(tl.int32)
    first = q_block * BLOCK_Q
    if first >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = first + rows // GROUP_PAD
    grp = rows % GROUP_PAD
    heads = kv_head * GROUP + grp
    row_ok = (tok < q_len) & (grp < GROUP)
    positions = context_len + tok
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    io_mask = row_ok[:, None] & dim_ok[None, :]

    q_rows = (q_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh
    q = tl.load(q_ptr + q_rows + dims[None, :] * stride_qd, mask=io_mask, other=0.0)
    q = q.to(tl.float32)
    table = block_tables_ptr + seq * stride_bt_seq

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, DIM_PAD], tl.float32)
    # Keys past the tile's last position are masked for every row: stop there.
    end = tl.minimum(seq_len, context_len + first + BLOCK_Q)
    for start in range(0, end, TILE_N):
        tokens = start + tl.arange(0, TILE_N)
        tok_ok = tokens < end
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
        visible = tok_ok[None, :] & (tokens[None, :] <= positions[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        # Key 0 is visible to every row, so m_new is finite from the first tile on.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new

    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_i[:, None]
    o_rows = (q_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh
    tl.store(
        out_ptr + o_rows + dims[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """``query`` ``[T, heads, head_dim]`` packed by ``query_start_loc`` -> same shape."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads is not a multiple of {num_kv_heads} kv heads")
    out = torch.empty_like(query)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_query_len <= 0:
        return out
    config = config or default_prefill_config(head_dim)
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    # At least 16 rows for tl.dot; no more query tokens than the longest chunk needs.
    block_q = max(1, config.block_m // group_pad, 16 // group_pad)
    block_q = min(block_q, max(triton.next_power_of_2(max_query_len), 16 // group_pad, 1))
    grid = (triton.cdiv(max_query_len, block_q), num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
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
        GROUP_PAD=group_pad,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_Q=block_q,
        TILE_N=config.tile_n,
        PRECISION=dot_precision(k_cache.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
