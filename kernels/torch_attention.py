"""The torch backend's fast CPU attention over a head-major paged pool.

The engine stores each layer's pool head-major: ``[kv_heads, num_blocks, block_size,
head_dim]`` underneath the logical ``[num_blocks, block_size, kv_heads, head_dim]`` view
(``head_major``). Copying one head's blocks into a decode row's slot is then a plain row
copy and attention runs as dense batched matrix products. ``kernels.reference`` is the plain
oracle these functions are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.decode_gather import BucketPlan


def head_major(cache: torch.Tensor) -> torch.Tensor | None:
    """The ``[kv_heads, num_blocks, block_size, head_dim]`` storage behind a logical cache
    view, when the pool is stored that way (else None)."""
    storage = cache.permute(2, 0, 1, 3)
    return storage if storage.is_contiguous() else None


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    storages: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
) -> None:
    """``key``/``value`` ``[T, kv_heads, dim]`` into the K and V storages at flat slot
    indices; a slot of -1 is a padding row, computed but not stored."""
    keep = slots >= 0
    if not bool(keep.all()):
        key, value, slots = key[keep], value[keep], slots[keep]
    for storage, new in zip(storages, (key, value), strict=True):
        flat = storage.view(storage.shape[0], -1, storage.shape[3])
        flat.index_copy_(1, slots, new.transpose(0, 1).to(storage.dtype))


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    storages: tuple[torch.Tensor, torch.Tensor],
    buckets: list[BucketPlan],
    layer: int,
    scale: float,
) -> torch.Tensor:
    """One query token per row: ``query`` ``[B, heads, dim]`` -> same shape.

    Each bucket keeps its rows' K/V in per-layer slot buffers (``kernels.decode_gather``);
    this layer first copies in what the plan says changed (blocks from the pool with
    ``index_select`` + ``index_copy_``, new tokens from ``key``/``value``), then attends over
    the bucket's slots as dense batched products. (With the native kernel the backend
    reads the pool itself instead: ``kernels.native``.)
    """
    out = torch.empty_like(query)
    for bucket in buckets:
        pair = bucket.buffers[layer]
        for buffer, storage, new in zip(pair, storages, (key, value), strict=True):
            if bucket.block_src is not None and bucket.block_dst is not None:
                flat = storage.view(storage.shape[0] * storage.shape[1], -1)
                rows = buffer.view(-1, flat.shape[1])
                rows.index_copy_(0, bucket.block_dst, flat.index_select(0, bucket.block_src))
            if bucket.token_rows is not None and bucket.token_dst is not None:
                tokens = new.index_select(0, bucket.token_rows).to(buffer.dtype)
                rows = buffer.view(-1, storage.shape[3])
                rows.index_copy_(0, bucket.token_dst, tokens.reshape(-1, storage.shape[3]))
        num_kv_heads, block_size, head_dim = (
            storages[0].shape[0],
            storages[0].shape[2],
            storages[0].shape[3],
        )
        n = bucket.rows.numel()
        span = bucket.width * block_size
        keys = pair[0][: n * num_kv_heads * span * head_dim].view(n * num_kv_heads, span, head_dim)
        values = pair[1][: n * num_kv_heads * span * head_dim].view(
            n * num_kv_heads, span, head_dim
        )
        result = _attend(query.index_select(0, bucket.rows), keys, values, bucket.seq_lens, scale)
        out.index_copy_(0, bucket.rows, result)
    return out


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Dense attention of ``[B, heads, dim]`` queries over ``[B * kv_heads, span, dim]`` keys
    and values (row-major, then head), masked past each row's length."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[0] // batch
    group, span = num_heads // num_kv_heads, keys.shape[1]
    q = query.reshape(batch * num_kv_heads, group, head_dim).to(keys.dtype)
    positions = torch.arange(span, device=query.device)
    bias = torch.zeros(batch, span, dtype=keys.dtype, device=query.device)
    bias.masked_fill_(positions[None, :] >= seq_lens[:, None], float("-inf"))
    bias = bias[:, None, None, :].expand(batch, num_kv_heads, group, span)
    scores = torch.baddbmm(
        bias.reshape(batch * num_kv_heads, group, span), q, keys.transpose(1, 2), alpha=scale
    )
    out = torch.bmm(torch.softmax(scores, dim=-1), values)
    return out.view(batch, num_heads, head_dim).to(query.dtype)


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
    (``causal_self_attention`` past one tile in float32, else causal SDPA); a chunk extending
    a cached prefix reads the sequence back from the pool.
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
        if seq_len == q_len and q_len > CAUSAL_TILE and query.dtype == torch.float32:
            causal_self_attention(
                query[start:end], key[start:end], value[start:end], scale, out[start:end]
            )
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


CAUSAL_TILE = 128
"""Query rows per tile of ``causal_self_attention`` (times the GQA group in one product).
A chunk of at most one tile goes to SDPA: one tile skips nothing and runs no faster there.

Numerics: float32 results differ from SDPA's flash kernel (which transformers also runs) by
rounding only (~1e-6 on the attention output; a prompt logprob near -37 moved by 1.5e-4),
greedy tokens unchanged in every equality test."""


def causal_self_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, out: torch.Tensor
) -> None:
    """A chunk that is its whole sequence: ``query`` ``[L, heads, dim]`` attends causally over
    ``key``/``value`` ``[L, kv_heads, dim]``, written into ``out`` (like ``query``).

    Query tiles of ``CAUSAL_TILE`` rows read only the keys up to their last row (the masked
    upper blocks are never computed) and the heads sharing a KV head go through one product,
    as plain batched matrix products: on CPU about a third less time than SDPA's flash
    kernel, whose 64-row float32 blocks run far below the matrix rate.
    """
    length, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    group = num_heads // num_kv_heads
    keys_t = key.permute(1, 2, 0)  # [kv_heads, dim, L]
    values = value.transpose(0, 1)  # [kv_heads, L, dim]
    heads = query.view(length, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    rows = out.view(length, num_kv_heads, group, head_dim)
    nothing = query.new_zeros(1, 1, 1)
    for start in range(0, length, CAUSAL_TILE):
        end = min(start + CAUSAL_TILE, length)
        n = end - start
        q = heads[:, :, start:end].reshape(num_kv_heads, group * n, head_dim)
        scores = torch.baddbmm(nothing, q, keys_t[:, :, :end], beta=0, alpha=scale)
        diagonal = scores.view(num_kv_heads, group, n, end)[..., start:end]
        diagonal.masked_fill_(_upper(n, query.device), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        tile = torch.bmm(probs, values[:, :end]).view(num_kv_heads, group, n, head_dim)
        rows[start:end].copy_(tile.permute(2, 0, 1, 3))


_UPPER: dict[tuple[int, torch.device], torch.Tensor] = {}


def _upper(n: int, device: torch.device) -> torch.Tensor:
    """``[n, n]`` bool, True above the diagonal (the keys after each query); kept."""
    mask = _UPPER.get((n, device))
    if mask is None:
        mask = _UPPER[(n, device)] = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return mask


def _sequence_keys(storage: torch.Tensor, table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's cached keys (or values) as ``[kv_heads, seq_len, head_dim]``."""
    gathered = storage.index_select(1, table)
    return gathered.view(storage.shape[0], -1, storage.shape[3])[:, :seq_len]
