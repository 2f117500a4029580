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
        return cls(
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.first_token_time,
            token_times=list(seq.token_times),
            finish_time=seq.finish_time,
            num_preemptions=seq.num_preemptions,
            num_cached_tokens=seq.num_cached_tokens,
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
        delta = detok.take_delta(seq.is_finished) if detok else ""  # advances ``emitted``
        return cls(
            request_id=seq.seq_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=seq.output_token_ids,
            new_token_ids=new_token_ids,
            text=detok.text[: detok.emitted] if detok else "",
            text_delta=delta,
            finish_reason=seq.finish_reason,
            metrics=RequestMetrics.of(seq),
            stop_reason=seq.stop_reason,
            error=error,
        )
