"""Decode blocks gathered once per layer and kept while the batch stays the same.

The torch decode path copies every decode row's blocks into dense buffers, layer by layer,
each step: about a quarter of a batch-64 decode step on CPU. Between two consecutive steps
with the same rows in the same bucket layout those copies differ only by the tokens the step
writes, so each layer keeps its own buffers and the next step copies in just its new tokens.
A row's table may grow by the block its new token opens: the rest of that block lies past the
row's length, masked. Anything else (a row joins, leaves or moves, a bucket widens, a block is
copied on write, a step is skipped) gathers afresh. When per-layer buffers would take more
bytes than the budget, every layer shares one pair and gathers each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Layout = list[tuple[int, int, int]]


@dataclass(slots=True)
class _Gathered:
    step: int
    seq_ids: list[str]
    layout: Layout
    tables: list[list[int]]


Buffers = dict[int, tuple[torch.Tensor, torch.Tensor]]


class DecodeGatherCache:
    def __init__(self, kv_caches: list[torch.Tensor], block_size: int, budget_bytes: int) -> None:
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.budget_bytes = budget_bytes
        self.kept_steps = 0
        self.gathered_steps = 0
        self._buffers: Buffers = {}
        self._capacity = 0
        self._per_layer = False
        self._last: _Gathered | None = None

    def plan(
        self,
        step: int,
        seq_ids: list[str],
        tables: list[list[int]],
        layout: Layout,
        new_positions: list[int],
        copies_blocks: bool,
    ) -> tuple[Buffers, torch.Tensor | None]:
        """Each layer's buffers (by K cache ``data_ptr()``) and, when last step's gather still
        holds, every row's new token inside its bucket's gathered keys (-1: writes nothing)."""
        cache = self.kv_caches[0]
        per_block = cache.shape[2] * cache.shape[3] * cache.shape[4]
        needed = sum((end - start) * width for start, end, width in layout) * per_block
        per_layer = 2 * len(self.kv_caches) * needed * cache.element_size() <= self.budget_bytes
        if needed > self._capacity or per_layer != self._per_layer:
            self._allocate(needed, per_layer)
        kept = None
        last = self._last
        if (
            per_layer
            and last is not None
            and last.step == step - 1
            and not copies_blocks
            and last.seq_ids == seq_ids
            and last.layout == layout
        ):
            kept = self._kept_positions(last.tables, tables, layout, new_positions)
        self._last = _Gathered(step, seq_ids, layout, tables) if per_layer else None
        if kept is None:
            self.gathered_steps += 1
            return self._buffers, None
        self.kept_steps += 1
        return self._buffers, torch.tensor(kept, dtype=torch.int64, device=cache.device)

    def _kept_positions(
        self, old: list[list[int]], new: list[list[int]], layout: Layout, positions: list[int]
    ) -> list[int] | None:
        size = self.block_size
        kept: list[int] = []
        for start, end, width in layout:
            for row in range(start, end):
                before, now, position = old[row], new[row], positions[row]
                if now[: len(before)] != before:
                    return None
                grown = len(now) - len(before)
                if grown and not (grown == 1 and position == len(before) * size):
                    return None
                kept.append(-1 if position < 0 else (row - start) * width * size + position)
        return kept

    def _allocate(self, needed: int, per_layer: bool) -> None:
        """A quarter of headroom, so a slowly growing batch does not reallocate every step;
        per-layer buffers never past the budget."""
        cache = self.kv_caches[0]
        capacity = needed + needed // 4
        if per_layer:
            most = self.budget_bytes // (2 * len(self.kv_caches) * cache.element_size())
            capacity = min(capacity, most)
        self._buffers.clear()
        self._capacity, self._per_layer, self._last = capacity, per_layer, None
        shared = None
        for layer in self.kv_caches:
            if shared is None or per_layer:
                shared = (
                    torch.empty(capacity, dtype=layer.dtype, device=layer.device),
                    torch.empty(capacity, dtype=layer.dtype, device=layer.device),
                )
            self._buffers[layer[0].data_ptr()] = shared
