"""Requests of ``n`` > 1 sequences: the prompt is computed once, then forked.

The engine admits such a request as one sequence (``index`` 0, the request id as its
``seq_id``). When that sequence samples its first token, its prompt's K/V are in the cache;
the engine then forks the other ``n - 1`` off its block table (``BlockManager.fork``: every
block shared, a write copies first) and hands them to the policy as running sequences
(``adopt``), so policies, runner and sampler only ever see ordinary sequences.

A child starts one token short: its prompt's last token counts as not computed, so its first
step recomputes that one position (a decode row; the block it writes is copied first, as the
child's first token would have had it copied anyway unless the prompt fills its last block)
and samples the child's own first token from its own logits, with its own generator. The
prompt's other blocks stay shared for the request's whole life.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

from engine.kv_cache import BlockManager
from engine.sampling_params import SEED_MAX
from engine.sequence import Sequence

NewSequence = Callable[..., Sequence]
"""``LLMEngine._new_sequence``: (seq_id, token_ids, params, arrival_time, index, request_id)."""

CHILD_SEPARATOR = "#"
"""A child's ``seq_id`` is ``f"{request_id}#{index}"``."""


def child_seed(seed: int | None, index: int) -> int | None:
    """Sequence ``index`` of a seeded request samples with ``seed + index`` (kept inside the
    range a 64-bit generator takes by wrapping, as ``manual_seed`` itself does)."""
    if seed is None:
        return None
    value = seed + index
    return value if value <= SEED_MAX else value - (SEED_MAX + 1)


@dataclass(slots=True)
class Family:
    """The sequences of one request with ``n`` > 1 (the first one, then its forks) and how
    many of them are unfinished. The request is over when none is and no fork is pending."""

    request_id: str
    seqs: list[Sequence] = field(default_factory=list)
    live: int = 0

    def unfinished(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.is_finished]

    def siblings_running(self, seq: Sequence) -> int:
        return self.live - (0 if seq.is_finished else 1)

    def fork(
        self,
        parent: Sequence,
        blocks: BlockManager,
        new_sequence: NewSequence,
        sequences: MutableMapping[str, Sequence],
    ) -> list[Sequence]:
        """The parent's first token is sampled, so its prompt's K/V are stored: fork the other
        sequences off its blocks and register them in ``sequences`` (the engine's live ones).
        Runs between steps; the caller hands the children to the policy (``adopt``)."""
        children: list[Sequence] = []
        prompt = parent.prompt_token_ids
        for index in range(1, parent.params.n):
            seq_id = f"{parent.seq_id}{CHILD_SEPARATOR}{index}"
            if seq_id in sequences:  # a caller's own request id took the name
                seq_id = f"{seq_id}{CHILD_SEPARATOR}{uuid.uuid4().hex[:8]}"
            child = new_sequence(
                seq_id, prompt, parent.params, parent.arrival_time, index, parent.request_id
            )
            blocks.fork(parent.seq_id, seq_id)
            blocks.trim(seq_id, len(prompt))  # a padded reservation is the parent's alone
            child.block_table = blocks.table(seq_id)
            child.num_computed_tokens = len(prompt) - 1  # recomputed: samples its own token
            child.num_cached_tokens = parent.num_cached_tokens
            child.first_scheduled_time = parent.first_scheduled_time
            child.priority, child.tenant = parent.priority, parent.tenant
            child.account = parent.account  # its tokens are its tenant's service too
            child.prompt_logprobs = parent.prompt_logprobs  # complete: the prompt is computed
            sequences[seq_id] = child
            children.append(child)
        self.seqs.extend(children)
        self.live += len(children)
        return children


class Families:
    """The engine's requests with ``n`` > 1, by request id, from admission until their last
    sequence ends; the engine tells it when a sequence arrives, samples a token, or ends early
    (error or abort). A request of one sequence is never in it."""

    def __init__(self) -> None:
        self._by_request: dict[str, Family] = {}

    def __bool__(self) -> bool:
        return bool(self._by_request)

    def __len__(self) -> int:
        return len(self._by_request)

    def admit(self, seq: Sequence) -> None:
        """A request's first sequence joined the engine."""
        if seq.params.n > 1:
            self._by_request[seq.request_id] = Family(seq.request_id, [seq], live=1)

    def on_token(
        self,
        seq: Sequence,
        blocks: BlockManager,
        new_sequence: NewSequence,
        sequences: MutableMapping[str, Sequence],
        forked: list[Sequence],
    ) -> int | None:
        """``seq`` appended a token (its stop checked). The first sequence's first token forks
        the others into ``forked`` (``Family.fork``); a finished one counts out. Returns how
        many of its siblings still run (None: ``seq`` is a request of one)."""
        family = self._by_request.get(seq.request_id)
        if family is None:
            return None
        if seq.index == 0 and len(seq.token_ids) - len(seq.prompt_token_ids) == 1:
            forked.extend(family.fork(seq, blocks, new_sequence, sequences))
        if seq.is_finished:
            self._count_out(family)
        return family.siblings_running(seq)

    def left(self, seq: Sequence) -> int:
        """``seq`` ended early (error or abort): how many of its request's sequences still
        run (0 for a request of one)."""
        family = self._by_request.get(seq.request_id)
        if family is None:
            return 0
        self._count_out(family)
        return family.live

    def unfinished(self, request_id: str) -> list[Sequence] | None:
        """The request's unfinished sequences (None: it is not a request of ``n`` > 1)."""
        family = self._by_request.get(request_id)
        return None if family is None else family.unfinished()

    def _count_out(self, family: Family) -> None:
        family.live -= 1
        if family.live == 0:  # the request is over: forget it
            del self._by_request[family.request_id]
