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
            child.prompt_logprobs = parent.prompt_logprobs  # complete: the prompt is computed
            sequences[seq_id] = child
            children.append(child)
        self.seqs.extend(children)
        self.live += len(children)
        return children
