"""The one entry point the model calls: write this step's K/V, then attend over the cache.

The runner orders a batch decodes first, then prefill chunks, and builds one
``AttentionMetadata`` per step that every layer shares.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Literal

import torch

from kernels import reference

Backend = Literal["torch", "triton"]
BackendChoice = Literal["auto", "torch", "triton"]


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(choice: BackendChoice, device: torch.device) -> Backend:
    """``auto`` picks Triton on CUDA and the torch reference everywhere else."""
    if choice == "torch":
        return "torch"
    if choice == "triton":
        if not triton_available():
            raise ValueError("attention_backend='triton' needs the triton package")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "attention_backend='triton' off CUDA needs TRITON_INTERPRET=1 set before "
                "triton is imported (the interpreter; slow, for tests)"
            )
        return "triton"
    if choice != "auto":
        raise ValueError(f"attention_backend must be auto, torch or triton, not {choice!r}")
    return "triton" if device.type == "cuda" and triton_available() else "torch"


@dataclass(slots=True)
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each one attends to."""

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_seq_lens: list[int]
    prefill_query_start_loc: list[int]
    prefill_seq_lens_tensor: torch.Tensor
    prefill_query_start_loc_tensor: torch.Tensor
    max_prefill_query_len: int
    backend: Backend = "torch"
    layer_workspaces: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None
    """Flat buffers each layer gathers its decode blocks into, by the K cache's
    ``data_ptr()`` (torch backend); layers may share one pair."""
    kept_positions: torch.Tensor | None = None
    """Set when each layer's buffers still hold last step's gather (reference.KeptGather)."""
    decode_buckets: list[tuple[int, int, int]] | None = None


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """``query`` ``[T, heads, dim]``, ``key``/``value`` ``[T, kv_heads, dim]``; ``kv_cache``
    is one layer's ``[2, num_blocks, block_size, kv_heads, dim]`` pool."""
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_decode = meta.num_decode_tokens
    if meta.backend == "triton":
        from kernels.triton import ops

        ops.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
    else:
        reference.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
    if num_decode == query.shape[0]:
        return _decode(query, key, value, k_cache, v_cache, meta, scale)
    if num_decode == 0:
        return _prefill(query, key, value, k_cache, v_cache, meta, scale)
    out = torch.empty_like(query)
    out[:num_decode] = _decode(
        query[:num_decode], key[:num_decode], value[:num_decode], k_cache, v_cache, meta, scale
    )
    out[num_decode:] = _prefill(
        query[num_decode:], key[num_decode:], value[num_decode:], k_cache, v_cache, meta, scale
    )
    return out


def _decode(query, key, value, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    if meta.backend == "triton":
        from kernels.triton import ops

        return ops.paged_decode_attention(
            query, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale
        )
    workspace = None
    if meta.layer_workspaces is not None:
        workspace = meta.layer_workspaces[k_cache.data_ptr()]
    kept = None
    if meta.kept_positions is not None:
        kept = reference.KeptGather(meta.kept_positions, key, value)
    return reference.decode_attention(
        query,
        k_cache,
        v_cache,
        meta.decode_block_tables,
        meta.decode_seq_lens,
        scale,
        workspace=workspace,
        buckets=meta.decode_buckets,
        kept=kept,
    )


def _prefill(query, key, value, k_cache, v_cache, meta, scale: float) -> torch.Tensor:
    if meta.backend == "triton":
        from kernels.triton import ops

        return ops.paged_prefill_attention(
            query,
            k_cache,
            v_cache,
            meta.prefill_block_tables,
            meta.prefill_seq_lens_tensor,
            meta.prefill_query_start_loc_tensor,
            meta.max_prefill_query_len,
            scale,
        )
    return reference.prefill_attention(
        query,
        k_cache,
        v_cache,
        meta.prefill_block_tables,
        meta.prefill_seq_lens,
        meta.prefill_query_start_loc,
        scale,
        key=key,
        value=value,
    )
