"""What the engine hands back each step: cumulative tokens plus the streaming deltas.

Outputs are snapshots, yet building one is O(1): copying a request's tokens, token times and
text every step would cost O(length) per sequence-step. The engine only ever appends to those
(the detokenizer's text is cut only beyond what it emitted), so "the first ``n`` items of the
live list" *is* the snapshot. ``of()`` records ``n`` and the ``Lazy`` fields copy the prefix on
first read, then keep it. Readers see plain lists, strings and dataclasses (==, slicing,
``asdict``, pickling, pydantic); nothing in an output is shared with the live request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engine.sequence import Sequence
from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One output token's log-probability under the model's raw distribution (a log-softmax of
    the logits before temperature, top-k and top-p), and the ``top`` alternatives asked for
    (``SamplingParams.logprobs``), most likely first, as ``(token_id, logprob)``. The chosen
    token may or may not be among them, as in OpenAI's answers."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Lazy:
    """A field of a ``@dataclass(slots=True)`` whose slot left unset means "not copied yet"
    (``of()`` builds with ``__new__`` and skips it): the first read computes it with
    ``resolve(obj)`` and stores it. Installed over the field's slot after ``@dataclass`` ran,
    so the field keeps its default and place, and ``__init__`` sets it as usual."""

    __slots__ = ("name", "resolve", "slot")

    def __init__(self, name: str, slot: Any, resolve: Callable[[Any], Any]) -> None:
        self.name, self.slot, self.resolve = name, slot, resolve

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            return self.slot.__get__(obj)
        except AttributeError:
            value = self.resolve(obj)
            self.slot.__set__(obj, value)
            return value

    def __set__(self, obj: Any, value: Any) -> None:
        self.slot.__set__(obj, value)

    @classmethod
    def install(cls, owner: type, name: str, resolve: Callable[[Any], Any]) -> None:
        setattr(owner, name, cls(name, owner.__dict__[name], resolve))


CountsT = TypeVar("CountsT")

# What ``RequestOutput.of`` counted: tokens, characters, then ``RequestMetrics._of``'s arguments
# (token times, first scheduled, first token, finish, preemptions, cached tokens).
OutputCounts = tuple[int, int, int, float | None, float | None, float | None, int, int]


class Snapshot(Generic[CountsT]):
    """Where a snapshot's lazy fields come from: the live request and what counted as of
    then (``CountsT``). Slots, not dataclass fields, so ``asdict``, ``==``, copies and pickles
    (dataclass's slots ``__getstate__`` reads every field) carry values, never the live
    request."""

    __slots__ = ("_counts", "_seq")
    _seq: Sequence
    _counts: CountsT

    def _bind(self, seq: Sequence, counts: CountsT) -> None:
        # Set here, in the class that declares the slots: mypy's dataclass plugin forgets a
        # base's __slots__ when it checks an assignment in a @dataclass(slots=True) subclass.
        self._seq, self._counts = seq, counts


@dataclass(slots=True)
class RequestMetrics(Snapshot[int]):
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
        times = self.token_times
        if len(times) < 2:
            return None
        return (times[-1] - times[0]) / (len(times) - 1)

    @property
    def e2e(self) -> float | None:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time

    @classmethod
    def of(cls, seq: Sequence) -> RequestMetrics:
        """The request's metrics now, in O(1) (``token_times`` is copied on first read)."""
        return cls._of(
            seq,
            len(seq.token_times),
            seq.first_scheduled_time,
            seq.first_token_time,
            seq.finish_time,
            seq.num_preemptions,
            seq.num_cached_tokens,
        )

    @classmethod
    def _of(
        cls,
        seq: Sequence,
        num_times: int,
        first_scheduled_time: float | None,
        first_token_time: float | None,
        finish_time: float | None,
        num_preemptions: int,
        num_cached_tokens: int,
    ) -> RequestMetrics:
        out = cls.__new__(cls)
        out.arrival_time = seq.arrival_time
        out.first_scheduled_time, out.first_token_time = first_scheduled_time, first_token_time
        out.finish_time, out.num_preemptions = finish_time, num_preemptions
        out.num_cached_tokens = num_cached_tokens
        out._bind(seq, num_times)
        return out


Lazy.install(RequestMetrics, "token_times", lambda m: m._seq.token_times[: m._counts])


@dataclass(slots=True)
class RequestOutput(Snapshot[OutputCounts]):
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
    index: int = 0
    """Which of the request's ``n`` sequences this is (0 .. n-1)."""
    siblings_running: int = 0
    """The request's other sequences still unfinished (``n`` > 1), as of this output."""
    logprobs: list[TokenLogprob] | None = None
    """One per output token when ``SamplingParams.logprobs`` is set (copied on first read)."""
    new_logprobs: list[TokenLogprob] | None = None
    """Those of ``new_token_ids``."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """When ``SamplingParams.prompt_logprobs`` is set: entry ``i`` is prompt token ``i + 1``'s
    (the first has none). Complete from the first output token on (copied on first read)."""
    seq_id: str = ""
    """The engine sequence this is (``RequestSnapshot.id``): ``request_id`` for the first,
    the fork's own id for the others of ``n`` > 1; empty in an output built by hand."""
    tenant: str = DEFAULT_TENANT
    priority: int = DEFAULT_PRIORITY
    """Whose request it is and its priority (engine/tenants.py), as it was queued."""

    @property
    def finished(self) -> bool:
        """This sequence is done (with ``n`` > 1 its siblings may not be)."""
        return self.finish_reason is not None

    @property
    def request_finished(self) -> bool:
        """Every sequence of the request is done: the request's last output."""
        return self.finish_reason is not None and self.siblings_running == 0

    @classmethod
    def of(
        cls,
        seq: Sequence,
        new_token_ids: list[int],
        error: str | None = None,
        siblings_running: int = 0,
    ) -> RequestOutput:
        """The request's output now, in O(1); takes the detokenizer's pending text delta."""
        out = cls.__new__(cls)  # hot: once per request per step; Lazy fields left unset
        out.request_id = seq.request_id
        out.seq_id = seq.seq_id
        out.tenant, out.priority = seq.tenant, seq.priority
        out.index = seq.index
        out.siblings_running = siblings_running
        logprobs = seq.logprobs  # ``out.logprobs`` is Lazy: never assigned here (a slow path)
        out.new_logprobs = (
            None if logprobs is None else logprobs[len(logprobs) - len(new_token_ids) :]
        )
        out.prompt_token_ids = seq.prompt_token_ids
        out.new_token_ids = new_token_ids
        out.finish_reason = seq.finish_reason
        out.stop_reason = seq.stop_reason
        out.error = error
        detok = seq.detokenizer
        out.text_delta = "" if detok is None else detok.take_delta(seq.is_finished)
        counts: OutputCounts = (  # tokens, characters, then what RequestMetrics.of copies, now
            len(seq.token_ids),
            0 if detok is None else detok.emitted,
            len(seq.token_times),
            seq.first_scheduled_time,
            seq.first_token_time,
            seq.finish_time,
            seq.num_preemptions,
            seq.num_cached_tokens,
        )
        out._bind(seq, counts)
        return out


def _text(out: RequestOutput) -> str:
    detok = out._seq.detokenizer
    return "" if detok is None else detok.text[: out._counts[1]]


Lazy.install(
    RequestOutput,
    "token_ids",
    lambda o: o._seq.token_ids[len(o.prompt_token_ids) : o._counts[0]],
)
Lazy.install(RequestOutput, "text", _text)
Lazy.install(
    RequestOutput,
    "logprobs",
    lambda o: (
        None
        if o._seq.logprobs is None
        else o._seq.logprobs[: o._counts[0] - len(o.prompt_token_ids)]
    ),
)
Lazy.install(
    RequestOutput,
    "prompt_logprobs",
    lambda o: None if o._seq.prompt_logprobs is None else list(o._seq.prompt_logprobs),
)
Lazy.install(RequestOutput, "metrics", lambda o: RequestMetrics._of(o._seq, *o._counts[2:]))
