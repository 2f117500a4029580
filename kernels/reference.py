"""Torch reference kernels for the paged KV cache.

Shapes (one layer): ``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]``; ``block_tables`` is ``[num_seqs, max_blocks]`` of physical block ids;
``seq_lens[i]`` is how many tokens of sequence ``i`` are in the cache once this step's keys
are written. A query chunk of ``q_len`` tokens holds the *last* ``q_len`` positions of its
sequence: query ``j`` sits at position ``seq_len - q_len + j`` and attends to keys ``0..pos``.

These are the semantics the Triton kernels are tested against, and the CPU fast path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    flat_k = k_cache.view(num_slots, *k_cache.shape[2:])
    flat_v = v_cache.view(num_slots, *v_cache.shape[2:])
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    flat_k.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    flat_v.index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One query token per sequence: ``query`` ``[B, heads, head_dim]`` -> same shape.

    Vectorised over the batch. The blocks of every sequence are gathered with
    ``index_select(out=...)`` into ``workspace`` when given: gathering into freshly
    allocated tensors each layer is several times slower on CPU (page faults).
    """
    batch, num_heads, head_dim = query.shape
    max_blocks = block_tables.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    span = max_blocks * block_size
    index = block_tables.reshape(-1).long()
    if workspace is None:
        keys = k_cache.index_select(0, index)
        values = v_cache.index_select(0, index)
    else:
        count = batch * max_blocks
        keys = torch.index_select(k_cache, 0, index, out=workspace[0][:count])
        values = torch.index_select(v_cache, 0, index, out=workspace[1][:count])
    keys = keys.view(batch, span, num_kv_heads, head_dim).transpose(1, 2)
    values = values.view(batch, span, num_kv_heads, head_dim).transpose(1, 2)
    positions = torch.arange(span, device=query.device)
    mask = (positions[None, :] < seq_lens[:, None].to(positions.dtype))[:, None, None, :]
    out = F.scaled_dot_product_attention(
        query[:, :, None, :].to(keys.dtype),
        keys,
        values,
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return out[:, :, 0, :].to(query.dtype)


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_start_loc: list[int],
    scale: float,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunked prefill / extend: ``query`` ``[T, heads, head_dim]`` packed by sequence.

    Each chunk attends causally over its sequence's cached prefix and its own tokens (already
    written to the cache). When a chunk is the whole sequence and ``key``/``value`` (the
    packed new keys) are given, they are used directly instead of reading the cache back.
    """
    num_heads, head_dim = query.shape[1], query.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        if key is not None and value is not None and seq_len == q_len:
            keys, values = key[start:end], value[start:end]
        else:
            num_blocks = -(-seq_len // block_size)
            table = block_tables[i, :num_blocks].long()
            keys = k_cache.index_select(0, table).view(-1, num_kv_heads, head_dim)[:seq_len]
            values = v_cache.index_select(0, table).view(-1, num_kv_heads, head_dim)[:seq_len]
        q = query[start:end].transpose(0, 1)[None]
        k = keys.transpose(0, 1)[None].to(q.dtype)
        v = values.transpose(0, 1)[None].to(q.dtype)
        gqa = num_heads != num_kv_heads
        if seq_len == q_len:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
            k_pos = torch.arange(seq_len, device=query.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[start:end] = o[0].transpose(0, 1)
    return out
