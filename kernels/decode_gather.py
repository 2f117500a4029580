"""The torch backend's decode buffers: each decode row's K/V kept in a slot across steps.

The torch decode path attends over dense copies of the decode rows' blocks. Gathering every
row afresh each step cost about a quarter of a batch-64 decode step on CPU, and the batch
changes often (a row joins or leaves, a row opens a block), so each layer keeps its own
buffers and each sequence its own slot in them: ``[rows, kv_heads, width * block_size, dim]``
per bucket (a short and a long bucket when that saves a fifth of the attention's reads).

A step then copies only what changed: a row's new token; a joining row's blocks (a row copy);
a row whose blocks changed under it (copy-on-write) from the first changed block. A leaving row
is replaced by its bucket's last row (that row is copied into the freed slot); a row outgrowing
its bucket moves to the wider one or, in the widest, the bucket's buffers grow (headroom in
rows and width, the kept rows copied over, not gathered again). The whole gather is redone
(``full_gathers``) only when a step did not finish (some layers may hold a newer copy) or a
step with decode rows was skipped. When the buckets attend over a third more blocks than a
fresh split would, their limits are re-split (at most every ``RELAYOUT_STEPS``) and only the
rows on the wrong side move. When per-layer buffers would take more bytes than the budget,
every layer shares one set and every row is gathered each step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

Buckets = list[tuple[int, int, int]]
"""``(first row, end row, table width)``: rows sorted by width, padded to a width."""
BufferPair = tuple[torch.Tensor, torch.Tensor]
ROW_HEADROOM = 4
"""Spare slots a bucket's buffers get when (re)allocated (plus a quarter of its rows)."""
WIDTH_HEADROOM = 2
"""Spare blocks per row a bucket's buffers get when (re)allocated (attended, masked)."""
RELAYOUT_STEPS = 8
"""Fewest steps between two re-splits of the buckets (rows moved by row copies)."""


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
class _Slot:
    seq_id: str
    table: list[int]
    valid: int
    """Positions ``[0, valid)`` of the slot hold the pool's K/V for ``table``."""


@dataclass(slots=True)
class _Bucket:
    limit: float
    """Rows up to this many blocks wide join this bucket (the last: any width)."""
    slots: list[_Slot] = field(default_factory=list)
    capacity: int = 0
    width: int = 0
    buffers: list[BufferPair] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class BucketPlan:
    """One bucket's step: its rows (batch order -> slot order) and what to copy in first."""

    rows: torch.Tensor
    """Batch rows in slot order (slot ``i`` holds batch row ``rows[i]``)."""
    seq_lens: torch.Tensor
    width: int
    """Blocks per slot in the buffers (attended, masked past each row's length)."""
    buffers: list[BufferPair]
    """Per layer ``[capacity * kv_heads * width * block_size * dim]`` K and V."""
    block_src: torch.Tensor | None
    """Rows of the pool seen as ``[kv_heads * num_blocks, block_size * dim]`` to copy ..."""
    block_dst: torch.Tensor | None
    """... into these rows of the buffer seen as ``[capacity * kv_heads * width, -1]``."""
    token_rows: torch.Tensor | None
    """Batch rows whose new K/V is copied in, ``[n]`` ..."""
    token_dst: torch.Tensor | None
    """... at these rows of the buffer seen as ``[-1, dim]``, ``(row, head)`` order."""


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """Where one step's decode rows are kept and what each layer copies in before attending."""

    buckets: list[BucketPlan]
    full_gather: bool
    """Every row gathered from the pool this step (nothing was kept)."""


class DecodeGatherCache:
    def __init__(self, kv_caches: list[torch.Tensor], block_size: int, budget_bytes: int) -> None:
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.budget_bytes = budget_bytes
        self.kept_steps = 0
        """Steps with decode rows that gathered nothing afresh."""
        self.gathered_steps = 0
        """Steps that gathered every row afresh (``full_gathers``, counted once per step)."""
        self.row_copies = 0
        """Rows copied in from the pool (joining, moved, changed), not counting new tokens."""
        self.regrows = 0
        """Bucket buffers enlarged (kept rows copied over)."""
        self._buckets: list[_Bucket] = []
        self._where: dict[str, int] = {}
        self._planned = self._finished = -1
        self._laid_out = 0
        self._shared: BufferPair | None = None

    @property
    def full_gathers(self) -> int:
        return self.gathered_steps

    def stats(self) -> dict[str, int]:
        """What the bench reports per run (re-gathers per 100 decode steps)."""
        return {
            "decode_steps": self.kept_steps + self.gathered_steps,
            "full_gathers": self.gathered_steps,
            "row_copies": self.row_copies,
            "regrows": self.regrows,
        }

    def plan(
        self,
        step: int,
        seq_ids: list[str],
        tables: list[list[int]],
        seq_lens: list[int],
        new_positions: list[int],
    ) -> DecodePlan:
        """This step's slots and copies. ``new_positions[i]``: the position row ``i`` writes
        this step (its K/V is in the pool before attention), -1 for a pad row. ``finished``
        must follow the last layer, or the next step gathers afresh."""
        widths = [len(t) for t in tables]
        fresh = (
            self._finished != self._planned
            or self._planned != step - 1
            or not self._per_layer(self._buckets)
        )
        self._planned = step
        if fresh:
            self._lay_out(sorted(widths))
            self._laid_out = step
        elif step - self._laid_out >= RELAYOUT_STEPS and self._wasteful(widths):
            self._relimit(sorted(widths))
            self._laid_out = step
        present = set(seq_ids)
        for bucket in self._buckets:
            for slot in [s for s in bucket.slots if s.seq_id not in present]:
                self._remove(bucket, slot)
        for i, seq_id in enumerate(seq_ids):
            at = self._where.get(seq_id)
            belongs = next(k for k, b in enumerate(self._buckets) if widths[i] <= b.limit)
            if at is not None and at != belongs:
                self._remove(self._buckets[at], self._slot_of(at, seq_id))
                at = None
            if at is None:
                self._buckets[belongs].slots.append(_Slot(seq_id, [], 0))
                self._where[seq_id] = belongs
        self._fit(widths, seq_ids)
        if not self._per_layer(self._buckets):
            fresh = True
            for bucket in self._buckets:
                for slot in bucket.slots:
                    slot.valid = 0
        row_of = {s: i for i, s in enumerate(seq_ids)}
        plans = [
            self._bucket_plan(b, row_of, tables, seq_lens, new_positions, fresh)
            for b in self._buckets
            if b.slots
        ]
        if fresh:
            self.gathered_steps += 1
        else:
            self.kept_steps += 1
        return DecodePlan(plans, fresh)

    def finished(self) -> None:
        """Every layer has run this step's plan: the next step may keep it."""
        self._finished = self._planned

    def buffer_bytes(self) -> int:
        """Bytes the buckets' buffers hold now (each tensor once: layers may share one)."""
        tensors = {id(t): t for b in self._buckets for pair in b.buffers for t in pair}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def release(self) -> None:
        """Free every bucket's buffers (up to ``budget_bytes``, kept otherwise for the next
        step): the engine is idle. The next step lays them out and gathers afresh."""
        self._buckets, self._where, self._shared = [], {}, None
        self._planned = self._finished = -1

    def invalidate(self) -> None:
        """Blocks were copied (copy-on-write): the rows' tables tell which slots changed."""

    def _slot_of(self, at: int, seq_id: str) -> _Slot:
        return next(s for s in self._buckets[at].slots if s.seq_id == seq_id)

    def _remove(self, bucket: _Bucket, slot: _Slot) -> None:
        """The bucket's last row takes the freed slot (copied in again from the pool)."""
        index = bucket.slots.index(slot)
        last = bucket.slots.pop()
        self._where.pop(slot.seq_id, None)
        if last is not slot:
            bucket.slots[index] = last
            last.valid = 0

    def _lay_out(self, widths: list[int]) -> None:
        """Empty buckets for these widths (sorted), their buffers kept where they fit."""
        split = length_buckets(widths)
        limits = [float(w) for _, _, w in split[:-1]] + [float("inf")]
        old = self._buckets if self._per_layer(self._buckets) else []
        self._buckets = [_Bucket(limit) for limit in limits]
        for new, prior in zip(self._buckets, old, strict=False):
            new.capacity, new.width, new.buffers = prior.capacity, prior.width, prior.buffers
        self._where = {}

    def _wasteful(self, widths: list[int]) -> bool:
        """The buckets attend over a third more blocks than a fresh split would."""
        ideal = sum((e - s) * w for s, e, w in length_buckets(sorted(widths)))
        return 3 * sum(len(b.slots) * b.width for b in self._buckets) > 4 * ideal + 3

    def _relimit(self, widths: list[int]) -> None:
        """A fresh split's limits on the kept buckets (a second one added when there was one):
        only the rows on the wrong side of the new limit move (row copies)."""
        split = length_buckets(widths)
        if len(split) == 1:
            return
        self._buckets[0].limit = float(split[0][2])
        if len(self._buckets) == 1:
            self._buckets.append(_Bucket(float("inf")))

    def _fit(self, widths: list[int], seq_ids: list[str]) -> None:
        """Every bucket's buffers hold its rows at their widths; grown ones keep their rows."""
        width_of = dict(zip(seq_ids, widths, strict=True))
        for bucket in self._buckets:
            rows = len(bucket.slots)
            width = max((width_of[s.seq_id] for s in bucket.slots), default=0)
            narrowest = bucket.limit + WIDTH_HEADROOM  # its rows are never wider than limit
            if rows <= bucket.capacity and width <= bucket.width <= narrowest:
                continue
            capacity = max(bucket.capacity, rows + rows // 4 + ROW_HEADROOM)
            new_width = int(min(max(bucket.width, width + WIDTH_HEADROOM), narrowest))
            old, old_width = bucket.buffers, bucket.width
            kept = [s for s in bucket.slots if s.valid]
            bucket.capacity, bucket.width = capacity, new_width
            copying = bool(old and kept) and self._per_layer(self._buckets)
            bucket.buffers = self._allocate(capacity, new_width, zeroed=not copying)
            if copying:
                self.regrows += 1
                self._copy_over(old, bucket, len(bucket.slots), old_width)
            else:
                for slot in bucket.slots:
                    slot.valid = 0

    def _copy_over(self, old: list[BufferPair], bucket: _Bucket, rows: int, width: int) -> None:
        """The kept rows from buffers ``width`` blocks wide into the bucket's new ones (wider,
        or narrowed to a lowered limit)."""
        cache = self.kv_caches[0]
        heads, per = cache.shape[3], self.block_size * cache.shape[4]
        kept = min(width, bucket.width)
        for before, after in zip(old, bucket.buffers, strict=True):
            for src, dst in zip(before, after, strict=True):
                src_view = src.view(-1, heads, width, per)
                dst_view = dst.view(bucket.capacity, heads, bucket.width, per)
                count = min(rows, src_view.shape[0])
                dst_view[:count, :, :kept].copy_(src_view[:count, :, :kept])
                # the new buffers come unzeroed: what the copy did not write is zeroed here
                dst_view[:count, :, kept:].zero_()
                dst_view[count:].zero_()

    def _per_layer(self, buckets: list[_Bucket]) -> bool:
        cache = self.kv_caches[0]
        per_block = cache.shape[2] * cache.shape[3] * cache.shape[4] * cache.element_size()
        slots = sum(b.capacity * b.width for b in buckets)
        return 2 * len(self.kv_caches) * slots * per_block <= self.budget_bytes

    def _allocate(self, capacity: int, width: int, zeroed: bool = True) -> list[BufferPair]:
        """Zeroed, unless the caller writes every element (``_copy_over`` copies the kept rows
        and zeroes the rest: zeroing all of them first cost as much again): masked positions
        are still multiplied, and garbage could be NaN."""
        cache = self.kv_caches[0]
        size = capacity * width * cache.shape[2] * cache.shape[3] * cache.shape[4]
        make = torch.zeros if zeroed else torch.empty
        buffers: list[BufferPair] = []
        for layer in self.kv_caches:
            if not buffers or self._per_layer(self._buckets):
                pair = (
                    make(size, dtype=layer.dtype, device=layer.device),
                    make(size, dtype=layer.dtype, device=layer.device),
                )
            buffers.append(pair)
        return buffers

    def _bucket_plan(
        self,
        bucket: _Bucket,
        row_of: dict[str, int],
        tables: list[list[int]],
        seq_lens: list[int],
        new_positions: list[int],
        fresh: bool,
    ) -> BucketPlan:
        cache = self.kv_caches[0]
        size, blocks, heads = self.block_size, cache.shape[1], cache.shape[3]
        rows: list[int] = []
        lens: list[int] = []
        src: list[int] = []
        dst: list[int] = []
        token_rows: list[int] = []
        token_dst: list[int] = []
        for index, slot in enumerate(bucket.slots):
            row = row_of[slot.seq_id]
            table, length, position = tables[row], seq_lens[row], new_positions[row]
            rows.append(row)
            lens.append(length)
            same = 0
            for a, b in zip(slot.table, table, strict=False):
                if a != b:
                    break
                same += 1
            valid = min(slot.valid, same * size)
            if position >= 0 and valid >= position:
                token_rows.append(row)
                base = index * heads * bucket.width * size + position
                token_dst.extend(base + h * bucket.width * size for h in range(heads))
            elif valid < length:
                if valid == 0 and not fresh:
                    self.row_copies += 1
                for j in range(valid // size, len(table)):
                    for h in range(heads):
                        src.append(h * blocks + table[j])
                        dst.append((index * heads + h) * bucket.width + j)
            slot.table, slot.valid = list(table), length
        device = cache.device

        def tensor(values: list[int]) -> torch.Tensor | None:
            return torch.tensor(values, dtype=torch.int64, device=device) if values else None

        return BucketPlan(
            torch.tensor(rows, dtype=torch.int64, device=device),
            torch.tensor(lens, dtype=torch.int64, device=device),
            bucket.width,
            bucket.buffers,
            tensor(src),
            tensor(dst),
            tensor(token_rows),
            tensor(token_dst),
        )
