"""The sampler's part of structured output (engine/grammar.py): each constrained row's
allowed tokens, as llguidance's bitmask, applied to its logits (disallowed -> ``-inf``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.grammar import GrammarState

if TYPE_CHECKING:
    from engine.sequence import Sequence


def mask_logits(
    logits: torch.Tensor, rows: list[tuple[int, GrammarState]], seqs: list[Sequence]
) -> dict[int, str]:
    """Apply each constrained row's allowed tokens to ``logits`` (in place; ``[rows, vocab]``
    float32): a token the grammar refuses becomes ``-inf``. Returns the rows that cannot go
    on, ``row -> reason`` (a matcher in its error state, e.g. past a parser limit)."""
    failed: dict[int, str] = {}
    live: list[tuple[int, GrammarState]] = []
    for row, state in rows:
        seq = seqs[row]
        if state.consumed != seq.num_output_tokens:  # e.g. output changed by a requeue
            state.sync(seq.output_token_ids)
        if (error := state.error) is not None:
            failed[row] = f"the grammar cannot go on: {error}"
        else:
            live.append((row, state))
    if not live:
        return failed
    vocab = logits.shape[-1]
    words = (vocab + 31) // 32
    bitmask = torch.zeros((len(live), words), dtype=torch.int32)
    # llguidance.torch's fill_next_token_bitmask, whose module imports torch.compile machinery
    # (seconds) for a kernel we do not use. One row after another: ~40 µs a row for a JSON
    # schema; llguidance's thread pool (LLExecutor) fought torch's threads for the cores.
    for i, (_, state) in enumerate(live):
        state.matcher.unsafe_compute_mask_ptr(bitmask[i].data_ptr(), words * 4)
    refused = ~unpack_bitmask(bitmask, vocab).to(logits.device)
    if len(live) == logits.shape[0]:
        logits.masked_fill_(refused, float("-inf"))
    else:  # row by row, in place (a gather and a scatter of the rows cost more)
        for i, (row, _) in enumerate(live):
            logits[row].masked_fill_(refused[i], float("-inf"))
    return failed


_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's ``[rows, ceil(vocab / 32)]`` int32 bitmask (bit ``i % 32`` of word
    ``i // 32`` says token ``i`` is allowed) as a ``[rows, vocab]`` bool tensor. (llguidance's
    own ``apply_token_bitmask_inplace`` is a ``torch.compile`` kernel: a compiler at run time.)"""
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
