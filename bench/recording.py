"""A runner wrapper that notes what each step computed: its padding split and, when asked,
the batch shapes the replay bound runs again through the forward alone."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.batch import ScheduledBatch, StepResult
from engine.runner import Runner


@dataclass(frozen=True, slots=True)
class EntryShape:
    """One sequence's share of a step, enough to rebuild an equivalent batch. ``blocks`` is its
    block table at the time: the replay gathers from the same scattered blocks the run did."""

    computed: int
    new: int
    pads: int
    sample: bool
    blocks: tuple[int, ...] = ()


@dataclass(slots=True)
class StepTokens:
    prefill: int = 0
    prefill_pads: int = 0
    decode: int = 0
    decode_pads: int = 0
    instrument_s: float = 0.0


@dataclass
class RecordingRunner:
    """Stands in for the engine's runner: same ``execute`` and ``last_forward_s``.

    ``instrument_s`` is the time spent here noting things, subtracted from the engine's step
    wall time so the bench does not inflate the engine overhead it reports.
    """

    inner: Runner
    keep_shapes: bool = False
    tokens: list[StepTokens] = field(default_factory=list)
    shapes: list[list[EntryShape]] = field(default_factory=list)
    instrument_s: float = 0.0

    @property
    def last_forward_s(self) -> float:
        return self.inner.last_forward_s

    @property
    def device(self) -> Any:
        return getattr(self.inner, "device", None)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        started = time.perf_counter()
        counts = StepTokens()
        for entry in batch.entries:
            if entry.kind == "prefill":
                counts.prefill += entry.num_new_tokens
                counts.prefill_pads += entry.num_pad_tokens
            elif entry.kind == "decode":
                counts.decode += entry.num_new_tokens
                counts.decode_pads += entry.num_pad_tokens
            else:  # a finished row of a padded group, recomputed
                counts.decode_pads += entry.num_pad_tokens
        self.tokens.append(counts)
        if self.keep_shapes:
            self.shapes.append(
                [
                    EntryShape(
                        e.seq.num_computed_tokens,
                        e.num_new_tokens,
                        e.num_pad_tokens,
                        e.sample,
                        tuple(e.seq.block_table),
                    )
                    for e in batch.entries
                ]
            )
        counts.instrument_s = time.perf_counter() - started
        self.instrument_s += counts.instrument_s
        return self.inner.execute(batch)
