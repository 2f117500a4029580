"""One request's tokens, progress in the KV cache and timestamps."""

from __future__ import annotations

import enum
from collections import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.outputs import TokenLogprob

NO_BLOCKS: abc.Sequence[int] = ()
"""The block table of a sequence that holds no KV blocks."""


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    """``token_ids`` is prompt + output; ``num_computed_tokens`` of them have K/V in the cache.

    ``block_table`` is the BlockManager's read-only live view of the sequence's blocks
    (``BlockManager.table``), set when the sequence is admitted; the runner reads it.

    A request asking for ``n`` > 1 sequences is one sequence (``index`` 0, ``seq_id`` the
    request id) until its prompt is computed; then the engine forks the others (``index``
    1 .. n-1) off its KV blocks. ``request_id`` is the request all of them answer.
    """

    seq_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: abc.Sequence[int] = NO_BLOCKS
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    detokenizer: IncrementalDetokenizer | None = None
    index: int = 0
    request_id: str = ""
    logprobs: list[TokenLogprob] | None = None
    """One per output token when the request asks for them (``SamplingParams.logprobs``)."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """Entry ``i`` is prompt token ``i + 1``'s (``SamplingParams.prompt_logprobs``), filled as
    the prompt's chunks are computed; complete once the first output token is sampled."""

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if not self.request_id:
            self.request_id = self.seq_id
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = []

    def wants_prompt_logprob(self, position: int) -> bool:
        """Whether the logits computed at ``position`` give a prompt token's logprob that
        is still missing (the next token is in the prompt and not recorded yet)."""
        known = self.prompt_logprobs
        return known is not None and len(known) <= position < len(self.prompt_token_ids) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """More than one token still lacks K/V: the prompt (or a recompute) is not done."""
        return self.num_uncomputed_tokens > 1

    def append_token(self, token_id: int, now: float, logprob: TokenLogprob | None = None) -> None:
        self.token_ids.append(token_id)
        self.token_times.append(now)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)
        if self.first_token_time is None:
            self.first_token_time = now

    def finish(self, reason: str, now: float, stop_reason: str | int | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finish_time = now
