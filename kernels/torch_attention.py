"""The torch backend's fast CPU attention over a head-major paged pool.

The engine stores each layer's pool head-major: ``[kv_heads, num_blocks, block_size,
head_dim]`` underneath the logical ``[num_blocks, block_size, kv_heads, head_dim]`` view
(``head_major``). Gathering one head's blocks for a decode batch is then a plain row copy
and attention runs as dense batched matrix products. ``kernels.reference`` is the plain
oracle these functions are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

Buckets = list[tuple[int, int, int]]
"""``(first row, end row, table width)``: decode rows gathered together, padded to a width."""


def head_major(cache: torch.Tensor) -> torch.Tensor | None:
    """The ``[kv_heads, num_blocks, block_size, head_dim]`` storage behind a logical cache
    view, when the pool is stored that way (else None)."""
    storage = cache.permute(2, 0, 1, 3)
    return storage if storage.is_contiguous() else None


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, storages: tuple[torch.Tensor, torch.Tensor], slots
) -> None:
    """``key``/``value`` ``[T, kv_heads, dim]`` into the K and V storages at flat slot
    indices; a slot of -1 is a padding row, computed but not stored."""
    keep = slots >= 0
    if not bool(keep.all()):
        key, value, slots = key[keep], value[keep], slots[keep]
    for storage, new in zip(storages, (key, value), strict=True):
        flat = storage.view(storage.shape[0], -1, storage.shape[3])
        flat.index_copy_(1, slots, new.transpose(0, 1).to(storage.dtype))


@dataclass(slots=True)
class KeptGather:
    """The decode rows' blocks as gathered at the previous step, still valid but for this
    step's tokens: the same rows in the same order and bucket layout, each row's block table
    at most grown by the block its new token opens.

    ``new_positions[i]`` is row ``i``'s new token inside its bucket's gathered keys
    (``row_in_bucket * width * block_size + position``), -1 for a row that writes nothing.
    """

    new_positions: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor


def decode_attention(
    query: torch.Tensor,
    storages: tuple[torch.Tensor, torch.Tensor],
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    buckets: Buckets,
    buffers: tuple[torch.Tensor, torch.Tensor],
    kept: KeptGather | None = None,
) -> torch.Tensor:
    """One query token per row: ``query`` ``[B, heads, dim]`` -> same shape.

    Each bucket's blocks are gathered with ``index_select(out=...)`` into ``buffers`` (two
    flat tensors; bucket ``i`` right after bucket ``i - 1``): gathering into freshly
    allocated tensors each layer is several times slower on CPU (page faults). With ``kept``
    the buffers already hold last step's gather and only this step's tokens are copied in.
    """
    k_storage, v_storage = storages
    out = torch.empty_like(query) if len(buckets) > 1 else None
    offset = 0
    for start, end, width in buckets:
        rows = slice(start, end)
        tables = block_tables[rows, :width]
        size = k_storage.shape[0] * tables.numel() * k_storage[0, 0].numel()
        k_buf = buffers[0][offset : offset + size]
        v_buf = buffers[1][offset : offset + size]
        offset += size
        if kept is None:
            index = _head_major_rows(tables, k_storage.shape[0], k_storage.shape[1])
            keys, values = _gather(k_storage, index, k_buf), _gather(v_storage, index, v_buf)
        else:
            keys, values = _view(k_storage, k_buf), _view(v_storage, v_buf)
            _copy_new_tokens(keys, values, kept, rows)
        result = _attend(query[rows], keys, values, seq_lens[rows], scale)
        if out is None:
            return result
        out[rows] = result
    assert out is not None
    return out


def _attend(query, keys, values, seq_lens, scale) -> torch.Tensor:
    """Dense attention of ``[B, heads, dim]`` queries over gathered ``[kv_heads, B * width,
    block_size, dim]`` keys and values, masked past each row's length."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads, _, block_size, _ = keys.shape
    group = num_heads // num_kv_heads
    span = keys.shape[1] // batch * block_size
    keys = keys.view(num_kv_heads * batch, span, head_dim)
    values = values.view(num_kv_heads * batch, span, head_dim)
    # [B, kv_heads, group, dim] -> one (kv head, sequence) pair per batched product
    q = query.view(batch, num_kv_heads, group, head_dim).transpose(0, 1)
    q = q.reshape(num_kv_heads * batch, group, head_dim).to(keys.dtype)
    positions = torch.arange(span, device=query.device)
    masked = positions[None, :] >= seq_lens[:, None].to(positions.dtype)
    bias = torch.zeros(batch, span, dtype=keys.dtype, device=query.device)
    bias.masked_fill_(masked, float("-inf"))
    bias = bias[None, :, None, :].expand(num_kv_heads, batch, group, span)
    scores = torch.baddbmm(
        bias.reshape(num_kv_heads * batch, group, span), q, keys.transpose(1, 2), alpha=scale
    )
    out = torch.bmm(torch.softmax(scores, dim=-1), values)
    out = out.view(num_kv_heads, batch, group, head_dim).transpose(0, 1)
    return out.reshape(batch, num_heads, head_dim).to(query.dtype)


def _copy_new_tokens(keys, values, kept: KeptGather, rows: slice) -> None:
    positions = kept.new_positions[rows]
    new_keys, new_values = kept.key[rows], kept.value[rows]
    keep = positions >= 0
    if not bool(keep.all()):
        positions, new_keys, new_values = positions[keep], new_keys[keep], new_values[keep]
    for gathered, new in ((keys, new_keys), (values, new_values)):
        flat = gathered.view(gathered.shape[0], -1, gathered.shape[3])
        flat.index_copy_(1, positions, new.transpose(0, 1).to(gathered.dtype))


def _head_major_rows(block_tables: torch.Tensor, num_kv_heads: int, num_blocks: int):
    """Row ids of every (kv head, table entry) in the storage seen as ``[heads * blocks, -1]``.

    Selecting whole rows along dim 0 of a 2-D tensor is a plain row copy; the same selection
    along dim 1 of the 4-D storage runs 1.3-1.6x slower on CPU.
    """
    heads = torch.arange(num_kv_heads, device=block_tables.device)[:, None] * num_blocks
    return (heads + block_tables.reshape(1, -1).long()).reshape(-1)


def _gather(storage, rows, buffer) -> torch.Tensor:
    """``[kv_heads, entries, block_size, dim]``: the blocks at ``_head_major_rows``."""
    flat = storage.view(storage.shape[0] * storage.shape[1], -1)
    out = buffer[: rows.numel() * flat.shape[1]].view(rows.numel(), flat.shape[1])
    return _view(storage, torch.index_select(flat, 0, rows, out=out))


def _view(storage, gathered) -> torch.Tensor:
    return gathered.view(storage.shape[0], -1, *storage.shape[2:])


def prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    storages: tuple[torch.Tensor, torch.Tensor],
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_start_loc: list[int],
    scale: float,
) -> torch.Tensor:
    """Chunked prefill / extend: ``query`` ``[T, heads, dim]`` packed by sequence.

    A chunk that is its whole sequence attends over its own new ``key``/``value`` directly
    (causal SDPA); a chunk extending a cached prefix reads the sequence back from the pool.
    """
    num_heads = query.shape[1]
    k_storage, v_storage = storages
    num_kv_heads, block_size = k_storage.shape[0], k_storage.shape[2]
    gqa = num_heads != num_kv_heads
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        if seq_len == q_len:
            k = key[start:end].transpose(0, 1)
            v = value[start:end].transpose(0, 1)
        else:
            table = block_tables[i, : -(-seq_len // block_size)].long()
            k = _sequence_keys(k_storage, table, seq_len)
            v = _sequence_keys(v_storage, table, seq_len)
        q = query[start:end].transpose(0, 1)[None]
        k, v = k[None].to(q.dtype), v[None].to(q.dtype)
        if seq_len == q_len:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
            k_pos = torch.arange(seq_len, device=query.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[start:end] = o[0].transpose(0, 1)
    return out


def _sequence_keys(storage: torch.Tensor, table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's cached keys (or values) as ``[kv_heads, seq_len, head_dim]``."""
    gathered = storage.index_select(1, table)
    return gathered.view(storage.shape[0], -1, storage.shape[3])[:, :seq_len]
