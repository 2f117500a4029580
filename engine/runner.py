"""Turns a ScheduledBatch into one packed forward pass and samples the next tokens.

The interface the engine relies on is ``execute(batch) -> StepResult`` (engine/batch.py: the
sampled token ids, one per entry whose ``sample`` is set, in batch order, plus ``failed``, the
rows whose sampling failed, ``seq_id -> message``) and ``last_forward_s``; the simulator swaps
in a cost-model runner with the same two members. A row in ``failed`` ends only its own
request; an exception from ``execute`` (a failing forward) fails the whole step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple, Protocol

import torch

from engine.batch import ScheduledBatch, ScheduledSeq, StepResult
from engine.cpu import ComputeChoice
from engine.grammar_mask import MaskWorker
from engine.model.llama import LlamaForCausalLM
from engine.outputs import TokenLogprob
from engine.sampler import Sampler, token_logprobs
from engine.sequence import Sequence
from kernels.attention import AttentionInputs, AttentionMetadata
from kernels.native import NativeKernels
from kernels.registry import Backend, make_backend


class Runner(Protocol):
    @property
    def last_forward_s(self) -> float:
        """Seconds the last ``execute`` spent in the forward (the engine only reads it)."""
        ...

    def execute(self, batch: ScheduledBatch) -> StepResult: ...


PromptRow = tuple[int, Sequence, int]
"""``(row, sequence, position)``: a computed row whose logits give a prompt token's logprob
(``SamplingParams.prompt_logprobs``): that of the token after ``position``."""
BroadcastHook = Callable[[list[tuple[int, int]], list[int], list[int], AttentionInputs], None]
"""Tensor parallelism's hook (``engine.parallel.world``): the step's block copies, token ids,
positions and attention inputs, sent to the other ranks before rank 0's forward."""
PROMPT_LOGPROB_ROWS = 256
"""Prompt rows turned into logits at once (a long prompt's vocabulary-wide logits are big)."""


class DecodePart(NamedTuple):
    """The step's decode rows (one token each, pad rows included), shortest context first."""

    token_ids: list[int]
    positions: list[int]
    slots: list[int]
    seq_ids: list[str]
    seq_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: dict[int, int]
    """``id(entry)`` -> its row among the decode rows, for the entries that sample."""
    prompt_rows: list[PromptRow]


class PrefillPart(NamedTuple):
    """The step's prefill chunks, each with its padding, packed one after another."""

    token_ids: list[int]
    positions: list[int]
    slots: list[torch.Tensor]
    seq_lens: list[int]
    query_start_loc: list[int]
    block_tables: list[list[int]]
    sample_rows: dict[int, int]
    """``id(entry)`` -> the row of its last real token among the prefill rows."""
    prompt_rows: list[PromptRow]


class StepInputs(NamedTuple):
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: list[int]
    """Rows of the packed batch to sample from, in batch order (``sample_seqs``)."""
    sample_seqs: list[Sequence]
    prompt_rows: list[PromptRow]


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        block_size: int,
        backend: Backend,
        sampler: Sampler,
        pad_token_id: int = 0,
        native: NativeKernels | None = None,
        compute: ComputeChoice | None = None,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.attention = make_backend(backend, kv_caches, block_size, native)
        """Chosen once, here; owns whatever it keeps between steps (kernels.attention)."""
        self.compute = compute
        """The dtype and attention in force and why (``engine.builder``; None: not recorded)."""
        self.sampler = sampler
        self.pad_token_id = pad_token_id
        self.device = kv_caches[0].device
        self.last_forward_s = 0.0
        self.broadcast: BroadcastHook | None = None
        """Set on rank 0 of a tensor-parallel engine; None (one rank) costs one test a step."""
        self.masks = MaskWorker()
        """Structured output's masks, computed beside the forward (engine/grammar_mask.py)."""

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepResult:
        if batch.block_copies:
            self.attention.copy_blocks(batch.block_copies)
        step = self._prepare(batch)
        started = time.perf_counter()
        masks = self.masks.start(step.sample_seqs) if step.sample_rows else None
        try:
            hidden = self.model(step.input_ids, step.positions, self.attention, step.meta)
        except BaseException:
            if masks is not None:
                masks.wait()  # the matchers are the engine's again only once it is done
            raise
        result = StepResult([])
        if step.sample_rows:
            rows = torch.tensor(step.sample_rows, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, rows))
            if masks is None:
                result = self.sampler(logits, step.sample_seqs)
            else:
                result = self.sampler(logits, step.sample_seqs, masks)
        if step.prompt_rows:
            result = replace(
                result, prompt_logprobs=self._prompt_logprobs(hidden, step.prompt_rows)
            )
        elif not step.sample_rows and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last_forward_s = time.perf_counter() - started
        return result

    def release_buffers(self) -> None:
        """What the attention backend keeps between steps, freed (the engine is idle)."""
        self.attention.release_buffers()

    def _prompt_logprobs(
        self, hidden: torch.Tensor, rows: list[PromptRow]
    ) -> dict[str, tuple[int, list[TokenLogprob]]]:
        """Each asking sequence's prompt logprobs computed in this step, in position order."""
        out: dict[str, tuple[int, list[TokenLogprob]]] = {}
        for at in range(0, len(rows), PROMPT_LOGPROB_ROWS):
            part = rows[at : at + PROMPT_LOGPROB_ROWS]
            index = torch.tensor([row for row, _, _ in part], device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, index))
            next_ids = [seq.token_ids[position + 1] for _, seq, position in part]
            widths = [seq.params.prompt_logprobs or 0 for _, seq, _ in part]
            entries = token_logprobs(logits, next_ids, widths)
            for (_, seq, position), entry in zip(part, entries, strict=True):
                out.setdefault(seq.seq_id, (position, []))[1].append(entry)
        return out

    def _prepare(self, batch: ScheduledBatch) -> StepInputs:
        decode = self._prepare_decode([e for e in batch.entries if e.query_len == 1])
        prefill = self._prepare_prefill([e for e in batch.entries if e.query_len > 1])
        slot_mapping = torch.tensor(decode.slots, dtype=torch.int64)
        if prefill.slots:
            slot_mapping = torch.cat([slot_mapping, *prefill.slots])
        inputs = AttentionInputs(
            slot_mapping=slot_mapping,
            decode_seq_ids=decode.seq_ids,
            decode_block_tables=decode.block_tables,
            decode_seq_lens=decode.seq_lens,
            prefill_block_tables=prefill.block_tables,
            prefill_seq_lens=prefill.seq_lens,
            prefill_query_start_loc=prefill.query_start_loc,
        )
        token_ids = decode.token_ids + prefill.token_ids
        positions = decode.positions + prefill.positions
        if self.broadcast is not None:
            self.broadcast(batch.block_copies, token_ids, positions, inputs)
        meta = self.attention.prepare(inputs)
        offset = len(decode.token_ids)
        rows = decode.sample_rows | {k: offset + r for k, r in prefill.sample_rows.items()}
        prompt_rows = decode.prompt_rows + [(offset + r, s, p) for r, s, p in prefill.prompt_rows]
        sampled = [e for e in batch.entries if e.sample]
        dev = self.device
        return StepInputs(
            torch.tensor(token_ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            meta,
            [rows[id(e)] for e in sampled],
            [e.seq for e in sampled],
            prompt_rows,
        )

    def _prepare_decode(self, entries: list[ScheduledSeq]) -> DecodePart:
        """One token per row; a pad row recomputes its last token and stores nothing."""
        size = self.block_size
        part = DecodePart([], [], [], [], [], [], {}, [])
        for entry in sorted(entries, key=lambda e: e.seq.num_computed_tokens):
            seq = entry.seq
            if entry.kind == "pad":
                p = seq.num_computed_tokens - 1
                slot, seq_len = -1, seq.num_computed_tokens
            else:
                p = seq.num_computed_tokens
                slot, seq_len = seq.block_table[p // size] * size + p % size, p + 1
                if seq.prompt_logprobs is not None and seq.wants_prompt_logprob(p):
                    part.prompt_rows.append((len(part.token_ids), seq, p))
            if entry.sample:
                part.sample_rows[id(entry)] = len(part.token_ids)
            part.token_ids.append(seq.token_ids[p])
            part.positions.append(p)
            part.slots.append(slot)
            part.seq_ids.append(seq.seq_id)
            part.seq_lens.append(seq_len)
            part.block_tables.append(seq.block_table[: -(-seq_len // size)])
        return part

    def _prepare_prefill(self, entries: list[ScheduledSeq]) -> PrefillPart:
        """Each chunk's real tokens, then its padding (stored in the row's reserved slots)."""
        size = self.block_size
        part = PrefillPart([], [], [], [], [0], [], {}, [])
        for entry in entries:
            seq = entry.seq
            start, real = seq.num_computed_tokens, entry.num_new_tokens
            seq_len = start + real + entry.num_pad_tokens
            if entry.sample:
                part.sample_rows[id(entry)] = len(part.token_ids) + real - 1
            if seq.prompt_logprobs is not None:
                base = len(part.token_ids) - start
                part.prompt_rows.extend(
                    (base + p, seq, p)
                    for p in range(start, start + real)
                    if seq.wants_prompt_logprob(p)
                )
            part.token_ids.extend(seq.token_ids[start : start + real])
            part.token_ids.extend([self.pad_token_id] * entry.num_pad_tokens)
            part.positions.extend(range(start, seq_len))
            table = seq.block_table[: -(-seq_len // size)]
            if len(table) * size < seq_len:
                raise RuntimeError(f"sequence {seq.seq_id} has no slots for its padding")
            part.block_tables.append(table)
            part.seq_lens.append(seq_len)
            part.query_start_loc.append(part.query_start_loc[-1] + real + entry.num_pad_tokens)
            positions = torch.arange(start, seq_len)
            part.slots.append(torch.tensor(table)[positions // size] * size + positions % size)
        return part
