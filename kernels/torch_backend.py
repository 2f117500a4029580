"""The torch attention backend: the CPU path (any device torch runs on, no Triton).

It needs the pool stored head-major (``engine.kv_pool.allocate_kv_cache`` does). Decode rows
attend through the native paged kernel (``kernels.native``) where it is loaded and takes the
pool's shapes, reading the pool through the block tables. Otherwise the backend owns decode
gather buffers (``kernels.decode_gather``): each decode row keeps a slot in its length bucket
across steps, so a step copies in only what changed (``gathers.stats()``), and attends over
them with dense batched products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import torch_attention
from kernels.attention import AttentionBackend, AttentionInputs, AttentionMetadata, build_metadata
from kernels.decode_gather import DecodeGatherCache, DecodePlan
from kernels.native import NativeKernels


@dataclass(slots=True)
class TorchAttentionMetadata(AttentionMetadata):
    decode_plan: DecodePlan | None = None
    """Where the decode rows are gathered this step; None without decode rows or with the
    native kernel."""
    native_tables: torch.Tensor | None = None
    """The decode rows' block tables and lengths as int64, for the native kernel."""
    native_lens: torch.Tensor | None = None


class TorchAttentionBackend(AttentionBackend[TorchAttentionMetadata]):
    name = "torch"

    def __init__(
        self,
        kv_caches: list[torch.Tensor],
        block_size: int,
        gather_budget_bytes: int | None = None,
        native: NativeKernels | None = None,
    ) -> None:
        super().__init__(kv_caches, block_size)
        pool = kv_caches[0]
        self.native = (
            native
            if native is not None and native.supports(pool.shape[-1], pool.dtype, pool.device)
            else None
        )
        """The paged decode kernel (``kernels.native.load``) where it takes this pool; None:
        the gathered batched products."""
        self.storages: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer, cache in enumerate(kv_caches):
            k_storage, v_storage = (
                torch_attention.head_major(cache[0]),
                torch_attention.head_major(cache[1]),
            )
            if k_storage is None or v_storage is None:
                raise ValueError(
                    f"the torch attention backend needs a head-major pool (layer {layer}); "
                    "allocate it with engine.kv_pool.allocate_kv_cache"
                )
            self.storages.append((k_storage, v_storage))
        if gather_budget_bytes is None:
            gather_budget_bytes = 2 * sum(c.numel() * c.element_size() for c in kv_caches)
        self.gathers = DecodeGatherCache(kv_caches, block_size, gather_budget_bytes)
        """Decode slot buffers; kept per layer across steps up to twice the pool's bytes (the
        buckets pad rows to their width and keep headroom)."""
        self._step = 0

    def prepare(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        self._step += 1
        meta = build_metadata(inputs, self.device, TorchAttentionMetadata)
        tables = inputs.decode_block_tables
        if tables and self.native is not None:
            meta.native_tables = meta.decode_block_tables.long()
            meta.native_lens = meta.decode_seq_lens.long()
        elif tables:
            slots = inputs.slot_mapping[: len(tables)].tolist()
            # a decode row writes its last position, unless it is a pad row (slot -1)
            new_positions = [
                n - 1 if slot >= 0 else -1
                for n, slot in zip(inputs.decode_seq_lens, slots, strict=True)
            ]
            meta.decode_plan = self.gathers.plan(
                self._step,
                inputs.decode_seq_ids,
                tables,
                inputs.decode_seq_lens,
                new_positions,
            )
        return meta

    def write_kv(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, meta: TorchAttentionMetadata
    ) -> None:
        torch_attention.write_kv_cache(key, value, self.storages[layer], meta.slot_mapping)

    def decode(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: TorchAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if self.native is not None:
            assert meta.native_tables is not None and meta.native_lens is not None
            k_storage, v_storage = self.storages[layer]
            return self.native.paged_decode_attention(
                query, k_storage, v_storage, meta.native_tables, meta.native_lens, scale
            )
        plan = meta.decode_plan
        assert plan is not None, "decode rows without a decode plan"
        out = torch_attention.decode_attention(
            query, key, value, self.storages[layer], plan.buckets, layer, scale
        )
        if layer == len(self.kv_caches) - 1:
            self.gathers.finished()
        return out

    def prefill(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: TorchAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        return torch_attention.prefill_attention(
            query,
            key,
            value,
            self.storages[layer],
            meta.prefill_block_tables,
            meta.prefill_seq_lens,
            meta.prefill_query_start_loc,
            scale,
        )

    def release_buffers(self) -> None:
        self.gathers.release()

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        super().copy_blocks(copies)
        self.gathers.invalidate()
