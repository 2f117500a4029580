"""The sampler's part of structured output (engine/grammar.py): each constrained row's
allowed tokens, as llguidance's bitmask, applied to its logits (disallowed -> ``-inf``).

The masks are computed beside the forward: ``MaskWorker.start`` (the runner calls it before
the model runs) hands the step's constrained rows to one worker thread, which fills their
bitmask while the forward runs (llguidance drops the GIL, and so does torch); the sampler then
applies it (``PendingMasks.apply``). ``mask_logits`` does both at once, for a caller without
a worker. A step without a constrained row starts nothing.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.grammar import GrammarState

if TYPE_CHECKING:
    from engine.sequence import Sequence

GrammarRows = list[tuple[int, GrammarState]]
"""``(row, its grammar state)`` of the step's constrained rows, in batch order."""


def grammar_rows(seqs: list[Sequence]) -> GrammarRows:
    """The constrained rows (one attribute read per row)."""
    return [(row, g) for row, seq in enumerate(seqs) if (g := seq.grammar) is not None]


@dataclass(frozen=True, slots=True)
class StepMasks:
    """The allowed tokens of the rows that go on (``live``: row numbers), one bitmask row
    each; ``failed``: the rows whose grammar cannot go on, ``row -> reason``."""

    live: list[int]
    bitmask: torch.Tensor
    failed: dict[int, str]

    def apply(self, logits: torch.Tensor) -> dict[int, str]:
        """Refused tokens -> ``-inf`` in ``logits`` (in place, ``[rows, vocab]`` float32);
        returns ``failed``."""
        if not self.live:
            return self.failed
        vocab = logits.shape[-1]
        width = min(vocab, self.bitmask.shape[1] * 32)
        refused = ~unpack_bitmask(self.bitmask, width).to(logits.device)
        if width < vocab:  # ids past the grammar's vocabulary: never allowed
            pad = torch.ones(len(self.live), vocab - width, dtype=torch.bool, device=logits.device)
            refused = torch.cat([refused, pad], dim=1)
        if len(self.live) == logits.shape[0]:
            logits.masked_fill_(refused, float("-inf"))
        else:  # row by row, in place (a gather and a scatter of the rows cost more)
            for i, row in enumerate(self.live):
                logits[row].masked_fill_(refused[i], float("-inf"))
        return self.failed


def compute_masks(rows: GrammarRows, seqs: list[Sequence]) -> StepMasks:
    """Each row's bitmask, from its matcher (re-fed first where it is out of step with its
    sequence's output, e.g. after a requeue)."""
    failed: dict[int, str] = {}
    live: list[tuple[int, GrammarState]] = []
    for row, state in rows:
        seq = seqs[row]
        if state.consumed != seq.num_output_tokens:
            state.sync(seq.output_token_ids)
        if (error := state.error) is not None:
            failed[row] = f"the grammar cannot go on: {error}"
        else:
            live.append((row, state))
    words = (live[0][1].owner.vocab_size + 31) // 32 if live else 0
    bitmask = torch.zeros((len(live), words), dtype=torch.int32)
    # llguidance.torch's fill_next_token_bitmask, whose module imports torch.compile machinery
    # (seconds) for a kernel we do not use. One row after another: ~40 µs a row for a JSON
    # schema; llguidance's thread pool (LLExecutor) fought torch's threads for the cores.
    for i, (_, state) in enumerate(live):
        state.matcher.unsafe_compute_mask_ptr(bitmask[i].data_ptr(), words * 4)
    return StepMasks([row for row, _ in live], bitmask, failed)


def mask_logits(logits: torch.Tensor, rows: GrammarRows, seqs: list[Sequence]) -> dict[int, str]:
    """``compute_masks`` then ``apply``, here and now; returns the rows that cannot go on."""
    return compute_masks(rows, seqs).apply(logits)


class PendingMasks:
    """A step's masks being computed on the worker thread."""

    def __init__(self, future: Future[StepMasks]) -> None:
        self._future = future

    def apply(self, logits: torch.Tensor) -> dict[int, str]:
        return self._future.result().apply(logits)

    def wait(self) -> None:
        """Until the worker is done with the matchers (the step failed before sampling: the
        engine may touch them next)."""
        self._future.exception()


class MaskWorker:
    """One thread (started on the first constrained step) that computes a step's masks
    while its forward runs."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def start(self, seqs: list[Sequence]) -> PendingMasks | None:
        """The constrained rows' masks, started; None where no row is constrained."""
        rows = grammar_rows(seqs)
        if not rows:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        return PendingMasks(self._pool.submit(compute_masks, rows, seqs))


_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's ``[rows, ceil(vocab / 32)]`` int32 bitmask (bit ``i % 32`` of word
    ``i // 32`` says token ``i`` is allowed) as a ``[rows, vocab]`` bool tensor. (llguidance's
    own ``apply_token_bitmask_inplace`` is a ``torch.compile`` kernel: a compiler at run time.)"""
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
