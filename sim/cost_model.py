"""The cost-model seam: what one engine step costs, predicted from its shape.

The simulator runs the real ``LLMEngine``, policies and ``BlockManager`` unchanged; only the
runner is swapped for one that asks a ``CostModel`` how long each step takes and advances a
virtual clock by that. A cost model sees a step as a ``StepShape``: the numbers a roofline or
a fitted model needs (tokens computed, the context each attends over), never the sequences.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from engine.batch import ScheduledBatch


@dataclass(frozen=True, slots=True)
class StepShape:
    """One step as a cost model sees it.

    ``prefill_tokens[i]`` new tokens of prefill chunk ``i`` (padding included: a padded group
    computes its pad rows) attend over ``prefill_context[i]`` tokens already cached plus
    themselves; each decode row ``j`` computes one token over ``decode_context[j]`` tokens
    (itself included). Pad rows of a finished member of a padded group count as decodes.
    """

    prefill_tokens: tuple[int, ...] = ()
    prefill_context: tuple[int, ...] = ()
    decode_context: tuple[int, ...] = ()

    @classmethod
    def of(cls, batch: ScheduledBatch) -> StepShape:
        prefill_tokens: list[int] = []
        prefill_context: list[int] = []
        decode_context: list[int] = []
        for entry in batch.entries:
            computed = entry.seq.num_computed_tokens
            if entry.kind == "prefill":
                prefill_tokens.append(entry.num_new_tokens + entry.num_pad_tokens)
                prefill_context.append(computed)
            else:  # a decode row, or a finished row recomputing its last token as padding
                decode_context.append(computed + entry.num_new_tokens)
        return cls(tuple(prefill_tokens), tuple(prefill_context), tuple(decode_context))

    @property
    def num_tokens(self) -> int:
        """Tokens the forward computes (prefill chunks plus one per decode row)."""
        return sum(self.prefill_tokens) + len(self.decode_context)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_tokens) + len(self.decode_context)


class CostModel(ABC):
    """Predicts the wall time of one engine step on one machine for one model shape."""

    name: str
    """What the predictions are stated with (a profile's or a calibration file's name)."""

    @abstractmethod
    def step_time(self, shape: StepShape) -> float:
        """Seconds the step takes: the forward, sampling and the engine's own overhead."""

    def kv_cache_blocks(self, block_size: int) -> int | None:
        """KV blocks a real engine on this machine would have for this model (GPU memory ×
        utilisation − weights − activation reserve), or None to keep the caller's pool."""
        return None


class Scaled(CostModel):
    """``inner`` with every step ``factor`` times as long: a cost model corrected by what the
    engine was observed to do (``sim.correction``: its recent steps, observed ÷ predicted)."""

    def __init__(self, inner: CostModel, factor: float) -> None:
        if not factor > 0:
            raise ValueError(f"a cost model's scale must be positive, got {factor}")
        self.inner = inner
        self.factor = factor
        self.name = inner.name

    def step_time(self, shape: StepShape) -> float:
        return self.inner.step_time(shape) * self.factor

    def kv_cache_blocks(self, block_size: int) -> int | None:
        return self.inner.kv_cache_blocks(block_size)
