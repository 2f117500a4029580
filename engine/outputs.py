"""What the engine hands back each step: cumulative tokens plus the streaming deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def e2e(self) -> float | None:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @classmethod
    def of(cls, seq: Sequence) -> RequestMetrics:
        # positional, in field order: built once per request per step
        return cls(
            seq.arrival_time,
            seq.first_scheduled_time,
            seq.first_token_time,
            seq.token_times[:],
            seq.finish_time,
            seq.num_preemptions,
            seq.num_cached_tokens,
        )


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    text: str
    text_delta: str
    finish_reason: str | None
    metrics: RequestMetrics
    stop_reason: str | int | None = None
    error: str | None = None
    """Why the request failed (``finish_reason == "error"``); its neighbours are unharmed."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def of(cls, seq: Sequence, new_token_ids: list[int], error: str | None = None) -> RequestOutput:
        """The request's output now; takes the detokenizer's pending text delta."""
        detok = seq.detokenizer
        if detok is None:
            text = delta = ""
        else:
            delta = detok.take_delta(seq.is_finished)  # advances ``emitted``
            text = detok.text[: detok.emitted]
        prompt = seq.prompt_token_ids
        # positional, in field order: built once per request per step
        return cls(
            seq.seq_id,
            prompt,
            seq.token_ids[len(prompt) :],
            new_token_ids,
            text,
            delta,
            seq.finish_reason,
            RequestMetrics.of(seq),
            seq.stop_reason,
            error,
        )
