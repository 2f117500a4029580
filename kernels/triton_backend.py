"""The Triton attention backend: the CUDA path (and, under ``TRITON_INTERPRET=1``, the tests').

The kernels read the pool through its strides and the block tables directly, so the
backend keeps nothing between steps: its metadata is the common one.
"""

from __future__ import annotations

import torch

from kernels.attention import AttentionBackend, AttentionInputs, AttentionMetadata, build_metadata


class TritonAttentionBackend(AttentionBackend[AttentionMetadata]):
    name = "triton"

    def __init__(self, kv_caches: list[torch.Tensor], block_size: int) -> None:
        super().__init__(kv_caches, block_size)
        from kernels.triton import ops  # imports triton: only when this backend is chosen

        self.ops = ops

    def prepare(self, inputs: AttentionInputs) -> AttentionMetadata:
        return build_metadata(inputs, self.device)

    def write_kv(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata
    ) -> None:
        cache = self.kv_caches[layer]
        self.ops.write_kv_cache(key, value, cache[0], cache[1], meta.slot_mapping)

    def decode(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        cache = self.kv_caches[layer]
        return self.ops.paged_decode_attention(
            query, cache[0], cache[1], meta.decode_block_tables, meta.decode_seq_lens, scale
        )

    def prefill(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        cache = self.kv_caches[layer]
        return self.ops.paged_prefill_attention(
            query,
            cache[0],
            cache[1],
            meta.prefill_block_tables,
            meta.prefill_seq_lens_tensor,
            meta.prefill_query_start_loc_tensor,
            meta.max_prefill_query_len,
            scale,
        )
