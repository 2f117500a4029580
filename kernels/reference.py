"""The plain attention oracle for the paged KV cache: every backend is tested against it.

Shapes (one layer): ``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]`` views of any strides; ``block_tables`` is ``[num_seqs, max_blocks]`` of physical
block ids; ``seq_lens[i]`` is how many tokens of sequence ``i`` are in the cache once this
step's keys are written. A query chunk of ``q_len`` tokens holds the *last* ``q_len``
positions of its sequence: query ``j`` sits at position ``seq_len - q_len + j`` and attends
to keys ``0..pos``.

Written to be obviously correct, not fast: one sequence at a time, its keys read back
through its block table, grouped-query heads repeated, scores and softmax in float32. No
buffers, no caching, no layout tricks; the engine's CPU path is ``kernels.torch_backend``.
"""

from __future__ import annotations

import torch


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[T, kv_heads, head_dim]`` at flat slot indices.

    ``slot = block_id * block_size + offset``; a slot of -1 marks a token that is computed
    but not stored (a padding row).
    """
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        k_cache[block, offset] = key[token].to(k_cache.dtype)
        v_cache[block, offset] = value[token].to(v_cache.dtype)


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence: ``query`` ``[B, heads, head_dim]`` -> same shape."""
    out = torch.empty_like(query)
    for row, seq_len in enumerate(seq_lens.tolist()):
        keys = sequence_cache(k_cache, block_tables[row], seq_len)
        values = sequence_cache(v_cache, block_tables[row], seq_len)
        positions = torch.tensor([seq_len - 1], device=query.device)
        out[row : row + 1] = attend(query[row : row + 1], keys, values, positions, scale)
    return out


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_start_loc: list[int],
    scale: float,
) -> torch.Tensor:
    """Chunked prefill / extend: ``query`` ``[T, heads, head_dim]`` packed by sequence.

    Chunk ``i`` is ``query[query_start_loc[i]:query_start_loc[i + 1]]``; it attends causally
    over its sequence's cached prefix and its own tokens (already written to the cache).
    """
    out = torch.empty_like(query)
    for row, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[row], query_start_loc[row + 1]
        if start == end:
            continue
        keys = sequence_cache(k_cache, block_tables[row], seq_len)
        values = sequence_cache(v_cache, block_tables[row], seq_len)
        positions = torch.arange(seq_len - (end - start), seq_len, device=query.device)
        out[start:end] = attend(query[start:end], keys, values, positions, scale)
    return out


def sequence_cache(cache: torch.Tensor, table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's first ``seq_len`` cached keys (or values): ``[seq_len, kv_heads, dim]``."""
    block_size = cache.shape[1]
    positions = torch.arange(seq_len, device=cache.device)
    blocks = table.to(cache.device).long()[positions // block_size]
    return cache[blocks, positions % block_size]


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    query_positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Queries ``[q, heads, dim]`` at ``query_positions`` over keys/values ``[n, kv_heads,
    dim]`` at positions ``0..n-1``, each query seeing the keys at or before its position."""
    group = query.shape[1] // keys.shape[1]
    keys = keys.float().repeat_interleave(group, dim=1)
    values = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale
    key_positions = torch.arange(keys.shape[0], device=query.device)
    future = key_positions[None, None, :] > query_positions[None, :, None]
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, values).to(query.dtype)
