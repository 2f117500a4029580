"""What a policy hands the runner each step, what the runner hands back (``StepResult``), and
the accounting every policy fills alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from engine.sequence import Sequence
from engine.timeline import Hold, PreemptCause, QueueHead

if TYPE_CHECKING:
    from engine.outputs import TokenLogprob

EntryKind = Literal["prefill", "decode", "pad"]


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence's share of a step.

    ``num_new_tokens`` real tokens get K/V computed and stored. ``num_pad_tokens`` are computed
    and then thrown away: after a prefill chunk they pad the row to its group's length (their
    K/V go to the row's reserved slots past its real tokens and are overwritten later); alone
    (``num_new_tokens == 0``) they recompute a finished row's last token, as a padded batch
    keeps computing rows that are done.
    """

    seq: Sequence
    num_new_tokens: int
    num_pad_tokens: int = 0
    kind: EntryKind = field(init=False)
    sample: bool = field(init=False)

    def __init__(self, seq: Sequence, num_new_tokens: int, num_pad_tokens: int = 0) -> None:
        # written out (dataclass keeps an explicit __init__): built once per sequence per step
        self.seq, self.num_new_tokens, self.num_pad_tokens = seq, num_new_tokens, num_pad_tokens
        uncomputed = len(seq.token_ids) - seq.num_computed_tokens
        if num_new_tokens == 0:
            self.kind = "pad"
        elif uncomputed == 1:
            self.kind = "decode"
        else:
            self.kind = "prefill"
        self.sample = num_new_tokens > 0 and num_new_tokens == uncomputed

    @property
    def query_len(self) -> int:
        return max(self.num_new_tokens + self.num_pad_tokens, 1)


@dataclass(slots=True)
class ScheduledBatch:
    entries: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    mode: str = ""
    # why requests wait (engine/timeline.py), filled by the policy
    admitted: list[Sequence] = field(default_factory=list)
    """Sequences given blocks in this step (new and resumed), in admission order."""
    preempt_causes: list[PreemptCause] = field(default_factory=list)
    """Why each of ``preempted`` was preempted, in the same order."""
    waiting_on: QueueHead | None = None
    """The waiting sequence first in the queue's order that the step did not admit, and
    what held it (None: nobody waits)."""
    paused: Hold | None = None
    """What held a running prefill that the step gave no tokens (None: none was held)."""
    # KV accounting once the step's tokens are stored (filled by the engine)
    kv_held_slots: int = 0
    kv_live_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.entries

    @property
    def num_seqs(self) -> int:
        return len(self.entries)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(e.num_new_tokens for e in self.entries if e.kind == "prefill")

    @property
    def num_decode_tokens(self) -> int:
        return sum(e.num_new_tokens for e in self.entries if e.kind == "decode")

    @property
    def num_padded_tokens(self) -> int:
        return sum(e.num_pad_tokens for e in self.entries)

    @property
    def num_computed_tokens(self) -> int:
        return sum(e.num_new_tokens + e.num_pad_tokens for e in self.entries)

    def token_counts(self) -> tuple[int, int, int]:
        """``(num_prefill_tokens, num_decode_tokens, num_padded_tokens)`` in one pass (the
        engine reads all three every step)."""
        prefill = decode = padded = 0
        for e in self.entries:
            if e.kind == "prefill":
                prefill += e.num_new_tokens
            elif e.kind == "decode":
                decode += e.num_new_tokens
            padded += e.num_pad_tokens
        return prefill, decode, padded

    def advance(self, dropped: set[str]) -> dict[str, tuple[int, int]]:
        """The rows ran: each sequence not in ``dropped`` now has K/V for its new tokens
        (``num_computed_tokens`` moves past them). Returns the ``[start, end)`` span each one
        wrote, by sequence id (what ``StepChanges.commit`` stores)."""
        written: dict[str, tuple[int, int]] = {}
        for entry in self.entries:  # hot: once per sequence per step
            num_new = entry.num_new_tokens
            if num_new:
                seq = entry.seq
                if dropped and seq.seq_id in dropped:
                    continue
                start = seq.num_computed_tokens
                seq.num_computed_tokens = end = start + num_new
                written[seq.seq_id] = (start, end)
        return written


FAILED_TOKEN = -1
"""The placeholder in ``StepResult.token_ids`` for a row whose sampling failed."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What ``Runner.execute`` returns: one token id per entry whose ``sample`` is set, in batch
    order, and the rows that failed (``seq_id -> error message``; their token is
    ``FAILED_TOKEN``). A failed row ends only its own request; the others are committed.
    ``logprobs``, aligned with ``token_ids``, is None unless some row asked for them (then
    None for the rows that did not). ``prompt_logprobs``: for the sequences that ask, the
    prompt logprobs this step computed, ``seq_id -> (index of the first, entries)``."""

    token_ids: list[int]
    failed: dict[str, str] = field(default_factory=dict)
    logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprob]]] | None = None


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A short description of the step in progress (for the stall watchdog and its log)."""

    number: int
    num_seqs: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    request_ids: tuple[str, ...] = ()

    MAX_IDS = 5

    @classmethod
    def of(
        cls, number: int, batch: ScheduledBatch, counts: tuple[int, int, int] | None = None
    ) -> StepInfo:
        """``counts``: the batch's ``token_counts()`` when the caller has them already."""
        prefill, decode, _ = counts or batch.token_counts()
        ids = tuple(e.seq.seq_id for e in batch.entries[: cls.MAX_IDS])
        return cls(number, len(batch.entries), prefill, decode, ids)

    def describe(self) -> str:
        more = self.num_seqs - len(self.request_ids)
        ids = ", ".join(self.request_ids) + (f" and {more} more" if more > 0 else "")
        return (
            f"step {self.number}: {self.num_seqs} sequences, {self.prefill_tokens} prefill + "
            f"{self.decode_tokens} decode tokens" + (f" ({ids})" if ids else "")
        )
