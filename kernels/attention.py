"""Attention backends: the one object the model calls to write this step's K/V and attend.

A backend is chosen once, when the runner is built (``kernels.registry.make_backend``), and owns
the KV pool's layers and whatever it keeps between steps. Each step the runner describes
the batch on the host (``AttentionInputs``: decode rows first, then prefill chunks); the
backend's ``prepare`` turns that into the ``AttentionMetadata`` every layer shares, and each
layer calls ``forward``. ``kernels.reference`` is the plain oracle every backend is tested
against.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar, overload

import torch


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    """One step's batch as the runner lays it out on the host: decode rows (one token each)
    first, then prefill chunks, packed in that order."""

    slot_mapping: torch.Tensor
    """Host int64, one slot per token (``block * block_size + offset``); -1: not stored."""
    decode_seq_ids: list[str]
    decode_block_tables: list[list[int]]
    """Each decode row's blocks up to its length; rows sorted by length (shortest first)."""
    decode_seq_lens: list[int]
    prefill_block_tables: list[list[int]]
    prefill_seq_lens: list[int]
    prefill_query_start_loc: list[int]
    """Chunk ``i`` is tokens ``[loc[i], loc[i + 1])`` of the prefill part; starts with 0."""

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_seq_lens)


@dataclass(slots=True)
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each one attends to (on device)."""

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


M = TypeVar("M", bound=AttentionMetadata)


@overload
def build_metadata(inputs: AttentionInputs, device: torch.device) -> AttentionMetadata: ...
@overload
def build_metadata(inputs: AttentionInputs, device: torch.device, cls: type[M]) -> M: ...
def build_metadata(
    inputs: AttentionInputs,
    device: torch.device,
    cls: type[AttentionMetadata] = AttentionMetadata,
) -> AttentionMetadata:
    """The device tensors every backend reads, from the host description, as ``cls`` (a
    backend's own metadata adds fields with defaults)."""
    starts = inputs.prefill_query_start_loc
    return cls(
        slot_mapping=inputs.slot_mapping.to(device),
        num_decode_tokens=inputs.num_decode_tokens,
        decode_block_tables=table_tensor(inputs.decode_block_tables, device),
        decode_seq_lens=torch.tensor(inputs.decode_seq_lens, dtype=torch.int32, device=device),
        prefill_block_tables=table_tensor(inputs.prefill_block_tables, device),
        prefill_seq_lens=inputs.prefill_seq_lens,
        prefill_query_start_loc=starts,
        prefill_seq_lens_tensor=torch.tensor(
            inputs.prefill_seq_lens, dtype=torch.int32, device=device
        ),
        prefill_query_start_loc_tensor=torch.tensor(starts, dtype=torch.int32, device=device),
        max_prefill_query_len=max((b - a for a, b in itertools.pairwise(starts)), default=0),
    )


def table_tensor(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """``[rows, longest]`` int32, short rows padded with block 0 (masked by the lengths)."""
    width = max((len(t) for t in tables), default=0)
    rows = [t + [0] * (width - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int32, device=device).view(len(tables), width)


class AttentionBackend(ABC, Generic[M]):
    """Writes K/V into the paged pool and attends over it, layer by layer.

    ``kv_caches[layer]`` is that layer's ``[2, num_blocks, block_size, kv_heads, dim]`` pool.
    ``forward`` is the same for every backend: write the step's K/V, then decode rows and
    prefill chunks; a backend supplies ``prepare`` and the three parts.
    """

    name: ClassVar[str]

    def __init__(self, kv_caches: list[torch.Tensor], block_size: int) -> None:
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = kv_caches[0].device

    @abstractmethod
    def prepare(self, inputs: AttentionInputs) -> M:
        """Once per step, before the forward: the metadata every layer of this step shares."""

    @abstractmethod
    def write_kv(self, layer: int, key: torch.Tensor, value: torch.Tensor, meta: M) -> None:
        """Store ``key``/``value`` ``[T, kv_heads, dim]`` at ``meta.slot_mapping``."""

    @abstractmethod
    def decode(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: M,
        scale: float,
    ) -> torch.Tensor:
        """The decode rows (``meta.num_decode_tokens`` leading tokens), K/V already written."""

    @abstractmethod
    def prefill(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: M,
        scale: float,
    ) -> torch.Tensor:
        """The prefill/extend chunks (the tokens after the decode rows), K/V already written."""

    def forward(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: M,
        scale: float,
    ) -> torch.Tensor:
        """``query`` ``[T, heads, dim]``, ``key``/``value`` ``[T, kv_heads, dim]`` -> like
        ``query``."""
        self.write_kv(layer, key, value, meta)
        num_decode = meta.num_decode_tokens
        if num_decode == query.shape[0]:
            return self.decode(layer, query, key, value, meta, scale)
        if num_decode == 0:
            return self.prefill(layer, query, key, value, meta, scale)
        out = torch.empty_like(query)
        d = slice(None, num_decode)
        p = slice(num_decode, None)
        out[d] = self.decode(layer, query[d], key[d], value[d], meta, scale)
        out[p] = self.prefill(layer, query[p], key[p], value[p], meta, scale)
        return out

    def release_buffers(self) -> None:
        """Drop what the backend keeps between steps (the engine went idle after a load): the
        next step builds it again. Nothing here; the torch backend frees its gather buffers."""

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: block ``src``'s K/V into block ``dst``, every layer."""
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]
