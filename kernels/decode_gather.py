"""The torch backend's decode buffers: blocks gathered once per layer and kept while the batch
stays the same.

The torch decode path copies every decode row's blocks into dense buffers, layer by layer,
each step: about a quarter of a batch-64 decode step on CPU. Between two consecutive steps
with the same rows in the same bucket layout those copies differ only by the tokens the step
writes, so each layer keeps its own buffers and the next step copies in just its new tokens.
A row's table may grow by the block its new token opens: the rest of that block lies past the
row's length, masked. Anything else (a row joins, leaves or moves, a bucket widens, a block is
copied on write, a step is skipped or does not finish) gathers afresh. When per-layer buffers
would take more bytes than the budget, every layer shares one pair and gathers each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.torch_attention import Buckets

BufferPair = tuple[torch.Tensor, torch.Tensor]


def length_buckets(widths: list[int]) -> Buckets:
    """Rows sorted by block count, split in two where that saves a fifth of the gather.

    The decode gather pads every row's block table to the widest in its bucket; with mixed
    lengths a short half and a long half each padded to their own widest gather far less.
    """
    whole = [(0, len(widths), max(widths, default=0))]
    if len(widths) < 8:
        return whole
    full = len(widths) * widths[-1]
    cost, split = min(
        (k * widths[k - 1] + (len(widths) - k) * widths[-1], k) for k in range(1, len(widths))
    )
    if cost > 0.8 * full:
        return whole
    return [(0, split, max(widths[:split])), (split, len(widths), max(widths[split:]))]


@dataclass(slots=True)
class _Gathered:
    step: int
    seq_ids: list[str]
    layout: Buckets
    tables: list[list[int]]


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """Where one step's decode rows are gathered, layer by layer."""

    buckets: Buckets
    buffers: list[BufferPair]
    """Per layer (``buffers[layer]``); layers share one pair when the budget is short."""
    kept_positions: torch.Tensor | None
    """Set when every layer's buffers still hold last step's gather (``KeptGather``)."""


class DecodeGatherCache:
    def __init__(self, kv_caches: list[torch.Tensor], block_size: int, budget_bytes: int) -> None:
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.budget_bytes = budget_bytes
        self.kept_steps = 0
        self.gathered_steps = 0
        self._buffers: list[BufferPair] = []
        self._capacity = 0
        self._per_layer = False
        self._last: _Gathered | None = None
        self._pending: _Gathered | None = None

    def plan(
        self,
        step: int,
        seq_ids: list[str],
        tables: list[list[int]],
        layout: Buckets,
        new_positions: list[int],
    ) -> DecodePlan:
        """This step's buffers and, when last step's gather still holds, every row's new token
        inside its bucket's gathered keys (-1: writes nothing). ``finished`` must follow the
        last layer, or the next step gathers afresh."""
        cache = self.kv_caches[0]
        per_block = cache.shape[2] * cache.shape[3] * cache.shape[4]
        needed = sum((end - start) * width for start, end, width in layout) * per_block
        per_layer = 2 * len(self.kv_caches) * needed * cache.element_size() <= self.budget_bytes
        if needed > self._capacity or per_layer != self._per_layer:
            self._allocate(needed, per_layer)
        kept = None
        last, self._last = self._last, None
        if (
            per_layer
            and last is not None
            and last.step == step - 1
            and last.seq_ids == seq_ids
            and last.layout == layout
        ):
            kept = self._kept_positions(last.tables, tables, layout, new_positions)
        self._pending = _Gathered(step, seq_ids, layout, tables) if per_layer else None
        if kept is None:
            self.gathered_steps += 1
            return DecodePlan(layout, self._buffers, None)
        self.kept_steps += 1
        positions = torch.tensor(kept, dtype=torch.int64, device=cache.device)
        return DecodePlan(layout, self._buffers, positions)

    def finished(self) -> None:
        """Every layer has gathered this step's plan: the next step may keep it."""
        self._last, self._pending = self._pending, None

    def invalidate(self) -> None:
        """Blocks changed under the gather (copy-on-write): the next step gathers afresh."""
        self._last = self._pending = None

    def _kept_positions(
        self, old: list[list[int]], new: list[list[int]], layout: Buckets, positions: list[int]
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
        self._capacity, self._per_layer, self._last = capacity, per_layer, None
        self._buffers = []
        for layer in self.kv_caches:
            if not self._buffers or per_layer:
                pair = (
                    torch.empty(capacity, dtype=layer.dtype, device=layer.device),
                    torch.empty(capacity, dtype=layer.dtype, device=layer.device),
                )
            self._buffers.append(pair)
