"""Turns a ScheduledBatch into one packed forward pass and samples the next tokens.

The interface the engine relies on is ``execute(batch) -> StepResult`` (engine/batch.py: the
sampled token ids, one per entry whose ``sample`` is set, in batch order, plus ``failed``, the
rows whose sampling failed, ``seq_id -> message``) and ``last_forward_s``; the simulator swaps
in a cost-model runner with the same two members. A row in ``failed`` ends only its own
request; an exception from ``execute`` (a failing forward) fails the whole step.
"""

from __future__ import annotations

import itertools
import time
from typing import Protocol

import torch

from engine.batch import ScheduledBatch, StepResult
from engine.decode_gather import DecodeGatherCache
from engine.model.llama import LlamaForCausalLM
from engine.sampler import Sampler
from engine.sequence import Sequence
from kernels.attention import AttentionMetadata, Backend


class Runner(Protocol):
    last_forward_s: float

    def execute(self, batch: ScheduledBatch) -> StepResult: ...


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        block_size: int,
        backend: Backend,
        sampler: Sampler,
        pad_token_id: int = 0,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.backend = backend
        self.sampler = sampler
        self.pad_token_id = pad_token_id
        self.device = kv_caches[0].device
        self.last_forward_s = 0.0
        self._step = 0
        self.decode_gathers = DecodeGatherCache(
            kv_caches, block_size, sum(c.numel() * c.element_size() for c in kv_caches)
        )
        """Decode gather buffers; kept per layer across steps up to as many bytes as the pool."""

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepResult:
        self._step += 1
        if batch.block_copies:
            self._copy_blocks(batch.block_copies)
        input_ids, positions, meta, sample_rows, sample_seqs = self._prepare(batch)
        started = time.perf_counter()
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        result = StepResult([])
        if sample_rows:
            rows = torch.tensor(sample_rows, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, rows))
            result = self.sampler(logits, sample_seqs)
        elif self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last_forward_s = time.perf_counter() - started
        return result

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]

    def _prepare(self, batch: ScheduledBatch):
        size = self.block_size
        decodes = sorted(
            (e for e in batch.entries if e.query_len == 1),
            key=lambda e: e.seq.num_computed_tokens,
        )
        prefills = [e for e in batch.entries if e.query_len > 1]
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        decode_lens: list[int] = []
        decode_tables: list[list[int]] = []
        new_positions: list[int] = []
        sample_index: dict[int, int] = {}
        for entry in decodes:
            seq = entry.seq
            if entry.kind == "pad":
                p = seq.num_computed_tokens - 1
                slot, seq_len = -1, seq.num_computed_tokens
            else:
                p = seq.num_computed_tokens
                slot, seq_len = seq.block_table[p // size] * size + p % size, p + 1
            if entry.sample:
                sample_index[id(entry)] = len(ids)
            ids.append(seq.token_ids[p])
            pos.append(p)
            slots.append(slot)
            new_positions.append(-1 if slot < 0 else p)
            decode_lens.append(seq_len)
            decode_tables.append(seq.block_table[: -(-seq_len // size)])
        prefill_lens: list[int] = []
        query_start = [0]
        prefill_tables: list[list[int]] = []
        prefill_slots: list[torch.Tensor] = []
        for entry in prefills:
            seq = entry.seq
            start, real = seq.num_computed_tokens, entry.num_new_tokens
            seq_len = start + real + entry.num_pad_tokens
            if entry.sample:
                sample_index[id(entry)] = len(ids) + real - 1
            ids.extend(seq.token_ids[start : start + real])
            ids.extend([self.pad_token_id] * entry.num_pad_tokens)
            pos.extend(range(start, seq_len))
            table = seq.block_table[: -(-seq_len // size)]
            if len(table) * size < seq_len:
                raise RuntimeError(f"sequence {seq.seq_id} has no slots for its padding")
            prefill_tables.append(table)
            prefill_lens.append(seq_len)
            query_start.append(query_start[-1] + real + entry.num_pad_tokens)
            positions_t = torch.arange(start, seq_len)
            prefill_slots.append(
                torch.tensor(table)[positions_t // size] * size + positions_t % size
            )
        slot_mapping = torch.tensor(slots, dtype=torch.int64)
        if prefill_slots:
            slot_mapping = torch.cat([slot_mapping, *prefill_slots])
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        for entry in batch.entries:
            if entry.sample:
                sample_rows.append(sample_index[id(entry)])
                sample_seqs.append(entry.seq)
        buckets = _length_buckets([len(t) for t in decode_tables])
        layer_workspaces, kept_positions = self._decode_buffers(
            batch, decodes, decode_tables, buckets, new_positions
        )
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(self.device),
            num_decode_tokens=len(decodes),
            decode_block_tables=self._table_tensor(decode_tables),
            decode_seq_lens=torch.tensor(decode_lens, dtype=torch.int32, device=self.device),
            prefill_block_tables=self._table_tensor(prefill_tables),
            prefill_seq_lens=prefill_lens,
            prefill_query_start_loc=query_start,
            prefill_seq_lens_tensor=torch.tensor(
                prefill_lens, dtype=torch.int32, device=self.device
            ),
            prefill_query_start_loc_tensor=torch.tensor(
                query_start, dtype=torch.int32, device=self.device
            ),
            max_prefill_query_len=max(
                (b - a for a, b in itertools.pairwise(query_start)), default=0
            ),
            backend=self.backend,
            layer_workspaces=layer_workspaces,
            kept_positions=kept_positions,
            decode_buckets=buckets,
        )
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        positions = torch.tensor(pos, dtype=torch.int64, device=self.device)
        return input_ids, positions, meta, sample_rows, sample_seqs

    def _table_tensor(self, tables: list[list[int]]) -> torch.Tensor:
        width = max((len(t) for t in tables), default=0)
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.device).view(len(tables), width)

    def _decode_buffers(self, batch, decodes, tables, buckets, new_positions):
        """Where the torch decode path gathers each layer's blocks, and whether last step's
        gather still holds (engine.decode_gather)."""
        if self.backend != "torch" or not tables:
            return None, None
        layout = buckets or [(0, len(tables), max(len(t) for t in tables))]
        return self.decode_gathers.plan(
            self._step,
            [entry.seq.seq_id for entry in decodes],
            tables,
            layout,
            new_positions,
            bool(batch.block_copies),
        )


def _length_buckets(widths: list[int]) -> list[tuple[int, int, int]] | None:
    """Split rows sorted by block count in two where that saves a fifth of the gather.

    The decode gather pads every row's block table to the longest; with mixed lengths a
    short half and a long half each padded to their own longest gather far less.
    """
    if len(widths) < 8:
        return None
    full = len(widths) * widths[-1]
    cost, split = min(
        (k * widths[k - 1] + (len(widths) - k) * widths[-1], k) for k in range(1, len(widths))
    )
    if cost > 0.8 * full:
        return None
    return [(0, split, widths[split - 1]), (split, len(widths), widths[-1])]
