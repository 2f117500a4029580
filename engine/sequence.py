"""One request's tokens, progress in the KV cache and timestamps."""

from __future__ import annotations

import enum
from collections import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.block_table import BlockTable
from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams
from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT, TenantAccount

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from engine.grammar import Grammars, GrammarState
    from engine.outputs import TokenLogprob

NO_BLOCKS = BlockTable([])
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
    # A factory only because dataclasses refuse an unhashable default: every sequence starts
    # on the one shared, read-only NO_BLOCKS. A list where a simulator lays out blocks itself.
    block_table: BlockTable | list[int] = field(default_factory=lambda: NO_BLOCKS)
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
    priority: int = DEFAULT_PRIORITY
    """Lower is served earlier where the queue discipline orders by it (engine/tenants.py)."""
    tenant: str = DEFAULT_TENANT
    account: TenantAccount | None = None
    """The engine's ledger entry of ``tenant`` (charged per sampled token); None outside an
    engine."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """Entry ``i`` is prompt token ``i + 1``'s (``SamplingParams.prompt_logprobs``), filled as
    the prompt's chunks are computed; complete once the first output token is sampled."""
    grammar: GrammarState | None = None
    """Where the output is in its grammar (``SamplingParams.constraint``; engine/grammar.py):
    the matcher has consumed the output tokens. None: unconstrained (costs nothing)."""

    @classmethod
    def start(
        cls,
        seq_id: str,
        token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        *,
        index: int = 0,
        request_id: str = "",
        seed: int | None = None,
        device: torch.device | None = None,
        tokenizer: Tokenizer | None = None,
        grammars: Grammars | None = None,
    ) -> Sequence:
        """A new sequence with what it samples and stops by: a generator seeded by ``seed``
        (on ``device``) when given, a detokenizer (for the stop strings and the text) when
        there is a ``tokenizer``, its own grammar state from ``grammars`` when the params
        carry a constraint."""
        seq = cls(seq_id, token_ids, params, arrival_time, index=index, request_id=request_id)
        if seed is not None:
            seq.generator = torch.Generator(device=device).manual_seed(seed)
        if tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer.for_prompt(
                tokenizer, len(token_ids), params.stop
            )
        if params.constraint is not None:
            if grammars is None:
                raise ValueError("a constrained request needs the engine's grammars")
            seq.grammar = grammars.state(params.constraint)
        return seq

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

    def add_prompt_logprobs(self, start: int, entries: list[TokenLogprob]) -> None:
        """Record what a step computed of the prompt's logprobs, entries ``start`` on (a chunk
        computed again, after a preemption, adds nothing)."""
        known = self.prompt_logprobs
        if known is not None and start <= len(known) < start + len(entries):
            known.extend(entries[len(known) - start :])

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

    def finish_if_stopped(
        self, token: int, now: float, eos_token_ids: abc.Set[int], max_model_len: int
    ) -> bool:
        """Finish if ``token``, just appended, ends the sequence; returns whether it did."""
        params = self.params
        matched = self.detokenizer.update(self.token_ids) if self.detokenizer else None
        ended = self.grammar is not None and self.grammar.advance(token)
        num_tokens = len(self.token_ids)
        if not params.ignore_eos and token in eos_token_ids:
            self.finish("stop", now)
        elif params.stop_token_ids and token in params.stop_token_ids:
            self.finish("stop", now, stop_reason=token)
        elif matched is not None:
            self.finish("stop", now, stop_reason=matched)
        elif ended:  # the grammar is complete: nothing but EOS may follow
            self.finish("stop", now)
        elif (
            num_tokens - len(self.prompt_token_ids) >= params.max_tokens
            or num_tokens >= max_model_len
        ):
            self.finish("length", now)
        else:
            return False
        return True

    def finish(self, reason: str, now: float, stop_reason: str | int | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finish_time = now
