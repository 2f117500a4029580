"""Why a request waits: one closed vocabulary of reasons and a timeline per request.

The policy knows why it stopped admitting. Each step it names the *head*: the sequence its
admission pass refused (or would have tried first, when the pass did not run), with the
constraint that refused it (a ``Hold``: a ``WaitReason`` and the figures that make it
concrete). Every other waiting sequence is ``BEHIND_QUEUE``: behind the head in the queue's
order, its waiting attributed to what held the head meanwhile.

``TimelineRecorder`` (engine thread only) keeps a timeline per request: contiguous
``Segment``s from arrival to the end (waiting with its reason, prefill with its chunks,
decoding) and the events between them (arrived, admitted, first token, preempted with its
cause, resumed, finished). It records on change, never per step: a segment keeps its reason
and the figures of its first and last step. Times are the engine's clock, as
``RequestMetrics``'s, so the waits before the first token plus the prefill segments before it
are the TTFT. Timelines are kept for the live requests and the last ``kept`` finished ones;
they hold no text.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.config import config_default
from engine.sequence import Sequence, SequenceStatus

DEFAULT_TIMELINES_KEPT: int = config_default("timelines_kept")
"""Finished requests whose timelines are kept (the oldest goes first; EngineConfig's)."""

DEFAULT_WAIT_WINDOW_S: float = config_default("wait_window_s")
"""The window of ``WaitSummary.recent``: the last this many seconds of waiting."""

_EPOCHS_BEFORE_TRIM = 256
"""Head epochs kept before those no open wait can need are dropped."""


class WaitReason(enum.Enum):
    """Why a waiting request was not admitted at a step (docs/observability.md)."""

    NEXT_STEP = "next_step"
    """Arrived (or was put back) while a step ran: it joins at the next step boundary."""
    PROMPT_BUDGET_SPENT = "prompt_budget_spent"
    """The step's prompt-token budget was spent (``TokenBudget``)."""
    KV_BLOCKS_SHORT = "kv_blocks_short"
    """The KV blocks free above the reserve were too few (``BlocksShort``)."""
    MAX_NUM_SEQS = "max_num_seqs"
    """The batch held ``max_num_seqs`` sequences (``SeqsFull``)."""
    DRAINING_CAP = "draining_cap"
    """A lowered cap: more sequences run than it allows, it drains to it (``SeqsFull``)."""
    HYBRID_SINGLE = "hybrid_single"
    """hybrid below its depth threshold runs one request at a time."""
    GROUP_RUNNING = "group_running"
    """static/dynamic: the running group must finish first."""
    GROUP_NOT_CHOSEN = "group_not_chosen"
    """static/dynamic: another group was chosen to run next."""
    GRAMMAR_COMPILING = "grammar_compiling"
    """Its grammar (structured output) is still compiling."""
    BEHIND_QUEUE = "behind_queue"
    """Behind the head in the queue's order; what held the head is in ``held_by``."""


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"


class PreemptCause(enum.Enum):
    MEMORY = "memory"
    """The pool ran dry for a running sequence's next tokens (the discipline's victim)."""
    PRIORITY = "priority"
    """A waiting request of a lower priority value took its place (``priority``, preempt)."""
    ROLLBACK = "rollback"
    """Its admission was undone with a failed step (the engine requeues it)."""


class EventKind(enum.Enum):
    ARRIVED = "arrived"
    ADMITTED = "admitted"
    FIRST_TOKEN = "first_token"
    PREEMPTED = "preempted"
    RESUMED = "resumed"
    AGED = "aged"
    """It had waited ``max_wait_s`` since arrival: aging puts it before any newer request."""
    POLICY_SWITCHED = "policy_switched"
    """A policy switch applied at a step boundary while it was live (``policy``: the new one)."""
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class CauseCount:
    """Preemptions of one cause."""

    cause: PreemptCause
    count: int

    @staticmethod
    def summed(counts: Iterable[CauseCount]) -> tuple[CauseCount, ...]:
        """Counts by cause, in the vocabulary's order (every cause, 0 where none)."""
        by: dict[PreemptCause, int] = {}
        for one in counts:
            by[one.cause] = by.get(one.cause, 0) + one.count
        return tuple(CauseCount(cause, by.get(cause, 0)) for cause in PreemptCause)


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """The prompt tokens the step could still take (``left``) of what it could carry
    (``budget``: ``max_prefill_tokens`` beside decodes, else the step budget after them);
    ``needed``: the tokens a prompt that may not be chunked needs at once (else None)."""

    left: int
    budget: int
    needed: int | None = None


@dataclass(frozen=True, slots=True)
class BlocksShort:
    """``needed`` blocks to admit the head (None: a running sequence's growth found the pool
    dry and was preempted) against ``free`` blocks above the ``reserve``."""

    needed: int | None
    free: int
    reserve: int


@dataclass(frozen=True, slots=True)
class SeqsFull:
    """``running`` sequences against the ``cap`` in force."""

    running: int
    cap: int


Figures = TokenBudget | BlocksShort | SeqsFull | None


@dataclass(frozen=True, slots=True)
class Hold:
    """A constraint that held a request at a step, with its figures."""

    reason: WaitReason
    figures: Figures = None


@dataclass(frozen=True, slots=True)
class QueueHead:
    """What a policy reports after planning a step: the waiting sequence first in its order
    that it did not admit, and why."""

    seq: Sequence
    hold: Hold


@dataclass(frozen=True, slots=True)
class HeldShare:
    """Seconds of a wait attributed to a reason (what held the queue's head)."""

    reason: WaitReason
    seconds: float

    @staticmethod
    def summed(shares: Iterable[HeldShare]) -> tuple[HeldShare, ...]:
        """Shares by reason, in the vocabulary's order."""
        by: dict[WaitReason, float] = {}
        for share in shares:
            by[share.reason] = by.get(share.reason, 0.0) + share.seconds
        return tuple(HeldShare(r, by[r]) for r in WaitReason if r in by)

    @staticmethod
    def fractions(shares: Iterable[HeldShare]) -> dict[WaitReason, float]:
        """Each reason's share of the waiting (summing to 1), in the vocabulary's order; empty
        when nothing waited."""
        summed = HeldShare.summed(shares)
        total = sum(share.seconds for share in summed)
        if total <= 0:
            return {}
        return {share.reason: share.seconds / total for share in summed if share.seconds > 0}


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch of a request's life. ``end`` is None while it lasts.

    Waiting: ``reason``; ``first``/``last`` are what held the queue's head at the segment's
    first and last step (the request's own hold when it was the head); ``ahead``: requests
    ahead of it in the queue's order at its first step (``BEHIND_QUEUE``); ``held_by``: its
    seconds by what held the head. Prefill: ``chunks`` (tokens per step) and ``resumed``
    (a recompute after a preemption)."""

    phase: Phase
    start: float
    end: float | None
    reason: WaitReason | None = None
    first: Hold | None = None
    last: Hold | None = None
    ahead: int | None = None
    held_by: tuple[HeldShare, ...] = ()
    chunks: tuple[int, ...] = ()
    resumed: bool = False

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    kind: EventKind
    time: float
    cause: PreemptCause | None = None
    finish_reason: str | None = None
    policy: str | None = None


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """A request's timeline as of when it was read (no prompt or output text). A request
    asking for ``n`` > 1 choices forks the others off its first sequence at its first token:
    ``forks`` are theirs (their segments up to the fork are the first sequence's)."""

    seq_id: str
    request_id: str
    arrival_time: float
    segments: tuple[Segment, ...]
    events: tuple[TimelineEvent, ...]
    finished: bool
    forks: tuple[RequestTimeline, ...] = ()

    @property
    def ttft(self) -> float | None:
        """Arrival to its first token (None: none yet), as ``RequestMetrics.ttft``."""
        for event in self.events:
            if event.kind is EventKind.FIRST_TOKEN:
                return event.time - self.arrival_time
        return None

    def waited(self, before: float | None = None) -> dict[WaitReason, float]:
        """Seconds waited by what held the queue's head (closed segments, up to ``before``)."""
        out: dict[WaitReason, float] = {}
        for seg in self.segments:
            if seg.phase is not Phase.WAITING or seg.end is None:
                continue
            if before is not None and seg.end > before:
                continue
            for share in seg.held_by:
                out[share.reason] = out.get(share.reason, 0.0) + share.seconds
        return out


@dataclass(frozen=True, slots=True)
class WaitNow:
    """Why a waiting request waits now: ``reason`` (its own, or ``BEHIND_QUEUE``), ``hold``:
    what holds it at the last step (its own hold, or the queue head's), ``ahead`` (behind the
    head: requests ahead of it at the wait's first step), ``seconds`` in this wait so far."""

    reason: WaitReason
    hold: Hold | None
    ahead: int | None
    seconds: float


@dataclass(frozen=True, slots=True)
class HeadHold:
    """The queue's head (the first waiting request in the queue's order not admitted at the
    last step) and what held it."""

    seq_id: str
    hold: Hold


@dataclass(frozen=True, slots=True)
class WaitSummary:
    """Where waiting time went, by what held the queue's head: ``recent`` over the last
    ``window_s`` seconds, ``total`` since the engine started (both include the waits still
    open); ``head``: what holds the queue now (None: nobody waits, or no step named one);
    ``tail``: the waiting of the requests finished in the window whose TTFT was at or over
    the window's TTFT p99 (``tail_ttft_s``), by reason."""

    window_s: float
    recent: tuple[HeldShare, ...]
    total: tuple[HeldShare, ...]
    head: HeadHold | None = None
    tail_ttft_s: float | None = None
    tail: tuple[HeldShare, ...] = ()

    @classmethod
    def merged(cls, each: list[WaitSummary]) -> WaitSummary | None:
        """Several engines' (a fleet's replicas), summed by reason; the first head named."""
        if not each:
            return None
        return cls(
            window_s=each[0].window_s,
            recent=HeldShare.summed(share for one in each for share in one.recent),
            total=HeldShare.summed(share for one in each for share in one.total),
            head=next((one.head for one in each if one.head is not None), None),
            tail_ttft_s=max((o.tail_ttft_s for o in each if o.tail_ttft_s), default=None),
            tail=HeldShare.summed(share for one in each for share in one.tail),
        )


class _Epoch:
    """A stretch during which the queue's head was held by one reason; ``before``: the
    seconds of every earlier epoch by reason (so a wait's shares are two look-ups)."""

    __slots__ = ("before", "end", "first", "last", "start")

    def __init__(self, start: float, hold: Hold, before: dict[WaitReason, float]) -> None:
        self.start, self.end = start, math.inf
        self.first = self.last = hold
        self.before = before

    def until(self, t: float) -> dict[WaitReason, float]:
        """Seconds by reason of the epochs up to ``t`` (within or after this one)."""
        upto = dict(self.before)
        if (held := min(t, self.end) - self.start) > 0:
            reason = self.first.reason
            upto[reason] = upto.get(reason, 0.0) + held
        return upto


class _Track:
    """A live request's timeline under construction (the recorder's own)."""

    __slots__ = (
        "admitted",
        "ahead",
        "chunks",
        "events",
        "first",
        "first_token",
        "forks",
        "last",
        "length",
        "mark",
        "phase",
        "reason",
        "resumed",
        "segments",
        "seq",
        "start",
    )

    def __init__(self, seq: Sequence, start: float) -> None:
        self.seq = seq
        self.segments: list[Segment] = []
        self.events = [TimelineEvent(EventKind.ARRIVED, start)]
        self.phase = Phase.WAITING
        self.start = start
        self.reason: WaitReason | None = WaitReason.NEXT_STEP
        self.first: Hold | None = None
        self.last: Hold | None = None
        self.ahead: int | None = None
        self.chunks: list[int] = []
        self.resumed = False
        self.mark = 0
        self.length = 0
        self.first_token = False
        self.admitted = False
        """Admitted once (its first wait, the one aging bounds, is over)."""
        self.forks: list[str] = []


Ahead = Callable[[list[Sequence]], list[int]]
"""How many waiting sequences are ahead of each given one in the queue's order (the policy's)."""


class TimelineRecorder:
    """Per-request timelines, recorded by the engine thread at changes (see the module)."""

    def __init__(
        self, kept: int = DEFAULT_TIMELINES_KEPT, window_s: float = DEFAULT_WAIT_WINDOW_S
    ) -> None:
        self.kept = kept
        self.window_s = window_s
        self.max_wait_s: float | None = None
        """The policy's aging bound in force (the engine sets it): a first wait past it is an
        ``AGED`` event."""
        self._waited: dict[WaitReason, float] = {}
        """Seconds of the closed waits by what held the head, since the start."""
        self._recent: deque[tuple[float, float, tuple[HeldShare, ...]]] = deque()
        """The closed waits (start, end, shares) that ended within the window, oldest first."""
        self._live: dict[str, _Track] = {}
        self._finished: OrderedDict[str, tuple[RequestTimeline, list[str]]] = OrderedDict()
        """Finished timelines, oldest first, each with its forks' ids."""
        self._undecided: list[_Track] = []
        """Waiting tracks not yet seen by a step (arrived, preempted, put back)."""
        self._prefilling: dict[str, _Track] = {}
        """Admitted tracks whose prompt (or recompute) is not done."""
        self._forked: list[_Track] = []
        """Forks made in this step: they prefill from the next one."""
        self._head: _Track | None = None
        self._epochs: list[_Epoch] = []
        self._current: _Epoch | None = None
        """The last epoch while the head is still held (its ``end`` is inf)."""
        self._starts: list[float] = []
        """Each epoch's start (for bisect)."""
        """What held the head, oldest first; the last one lasts (``end`` inf) while held."""
        self._trim_at = _EPOCHS_BEFORE_TRIM
        self._step_start = 0.0

    # -- the engine's calls ---------------------------------------------------------------

    def arrived(self, seq: Sequence) -> None:
        track = _Track(seq, seq.arrival_time)
        self._live[seq.seq_id] = track
        self._undecided.append(track)

    def scheduled(
        self,
        now: float,
        admitted: list[Sequence],
        preempted: list[Sequence],
        causes: list[PreemptCause],
        head: QueueHead | None,
        ahead: Ahead,
    ) -> None:
        """A step was planned at ``now``: who was admitted, preempted, and what held the head."""
        self._step_start = now
        if not (admitted or preempted or self._undecided) and head is not None:
            # most steps: the same head held for the same reason; only the figures move on
            held, current, same = self._head, self._current, head.hold
            if (
                held is not None
                and current is not None
                and held.seq is head.seq
                and held.reason is same.reason
                and current.first.reason is same.reason
            ):
                held.last = current.last = same
                return
        live = self._live
        hold = head.hold if head is not None else None
        for seq, cause in zip(preempted, causes, strict=True):
            if (track := live.get(seq.seq_id)) is not None:
                self._preempted(track, now, cause)
        for seq in admitted:
            if (track := live.get(seq.seq_id)) is None:
                continue
            resumed = track.resumed
            if not track.admitted:
                self._aged(track, now, track.events)
                track.admitted = True
            self._close(track, now)
            kind = EventKind.RESUMED if resumed else EventKind.ADMITTED
            track.events.append(TimelineEvent(kind, now))
            track.phase, track.start, track.reason = Phase.PREFILL, now, None
            track.resumed, track.mark = resumed, seq.num_computed_tokens
            track.length = len(seq.token_ids)
            self._prefilling[seq.seq_id] = track
            if track is self._head:
                self._head = None
        head_track = live.get(head.seq.seq_id) if head is not None else None
        if self._undecided:
            self._decide(now, head_track, hold, ahead)
        old = self._head
        if old is not None and old is not head_track:
            self._head = None
            if old.phase is Phase.WAITING and old.seq.status is SequenceStatus.WAITING:
                [n] = ahead([old.seq])
                self._wait(old, now, WaitReason.BEHIND_QUEUE, hold, n)
        if head_track is not None and hold is not None and head_track.phase is Phase.WAITING:
            if head_track is not self._head or head_track.reason is not hold.reason:
                self._wait(head_track, now, hold.reason, hold, None)
                self._head = head_track
            else:
                head_track.last = hold
        self._held(now, hold)

    def ran(self, paused: Hold | None) -> None:
        """The step's tokens are in: each prefill's chunk, its first token, or its pause."""
        if self._prefilling:
            self._ran(paused)
        if self._forked:
            for track in self._forked:
                self._prefilling[track.seq.seq_id] = track
            self._forked.clear()

    def _ran(self, paused: Hold | None) -> None:
        start = self._step_start
        done: list[str] = []
        for seq_id, track in self._prefilling.items():
            seq = track.seq
            computed = seq.num_computed_tokens
            if computed == track.mark:
                if track.phase is Phase.PREFILL:  # a running prefill given no tokens
                    hold = paused or Hold(WaitReason.PROMPT_BUDGET_SPENT)
                    self._close(track, start)
                    track.phase, track.start, track.reason = Phase.WAITING, start, hold.reason
                    track.first = track.last = hold
                elif paused is not None:
                    track.last = paused
                continue
            if track.phase is Phase.WAITING:  # a paused prefill goes on
                self._close(track, start)
                track.phase, track.start, track.reason = Phase.PREFILL, start, None
            track.chunks.append(computed - track.mark)
            track.mark = computed
            if len(seq.token_ids) > track.length:  # the step sampled its next token
                now = seq.token_times[-1]
                if not track.first_token:
                    track.first_token = True
                    track.events.append(TimelineEvent(EventKind.FIRST_TOKEN, now))
                self._close(track, now)
                track.phase, track.start = Phase.DECODE, now
                done.append(seq_id)
        for seq_id in done:
            del self._prefilling[seq_id]

    def forked(self, child: Sequence) -> None:
        """``child`` was forked off its request's first sequence at that one's first token:
        its timeline is the first one's until then."""
        parent = self._live.get(child.request_id)
        if parent is None:
            return
        now = parent.seq.token_times[-1] if parent.seq.token_times else self._step_start
        track = _Track(child, parent.start)
        track.segments = list(parent.segments)
        track.events = list(parent.events)
        track.phase, track.chunks, track.resumed = parent.phase, list(parent.chunks), parent.resumed
        if parent.phase is Phase.PREFILL and parent.seq.num_computed_tokens > parent.mark:
            track.chunks.append(parent.seq.num_computed_tokens - parent.mark)  # its last chunk
        self._close(track, now)
        track.phase, track.start, track.reason = Phase.PREFILL, now, None
        track.mark, track.length = child.num_computed_tokens, len(child.token_ids)
        track.admitted = True
        self._live[child.seq_id] = track
        self._forked.append(track)
        parent.forks.append(child.seq_id)

    def switched(self, now: float, policy: str, max_wait_s: float | None) -> None:
        """A policy switch applied at ``now``: an event on every live request."""
        self.max_wait_s = max_wait_s
        for track in self._live.values():
            track.events.append(TimelineEvent(EventKind.POLICY_SWITCHED, now, policy=policy))

    def put_back(self, seq: Sequence) -> None:
        """``seq``'s admission was undone (a failed step): it waits again from the step's start."""
        if (track := self._live.get(seq.seq_id)) is not None and track.phase is not Phase.WAITING:
            self._preempted(track, self._step_start, PreemptCause.ROLLBACK)

    def finished(self, seq: Sequence) -> None:
        """``seq`` ended (any reason): its timeline closes at its finish time and is kept."""
        track = self._live.pop(seq.seq_id, None)
        if track is None:
            return
        now = seq.finish_time if seq.finish_time is not None else self._step_start
        self._prefilling.pop(seq.seq_id, None)
        if track is self._head:
            self._head = None
        if not track.admitted:
            self._aged(track, now, track.events)
        if not track.first_token and seq.first_token_time is not None:
            track.first_token = True
            track.events.append(TimelineEvent(EventKind.FIRST_TOKEN, seq.first_token_time))
        if track.phase is Phase.PREFILL and track.mark != seq.num_computed_tokens:
            track.chunks.append(seq.num_computed_tokens - track.mark)
        self._close(track, now)
        track.events.append(TimelineEvent(EventKind.FINISHED, now, None, seq.finish_reason))
        if self.kept > 0:
            self._finished[seq.seq_id] = (self._frozen(track, now, finished=True), track.forks)
            while len(self._finished) > self.kept:
                self._finished.popitem(last=False)

    # -- reading --------------------------------------------------------------------------

    def timeline(self, seq_id: str, now: float) -> RequestTimeline | None:
        """A live request's timeline as of ``now``, or a kept finished one's (None: unknown
        or no longer kept), with its forks' (those still kept)."""
        if (track := self._live.get(seq_id)) is not None:
            found, forks = self._frozen(track, now, finished=False), track.forks
        elif (kept := self._finished.get(seq_id)) is not None:
            found, forks = kept
        else:
            return None
        if not forks:
            return found
        children = (self.timeline(fork, now) for fork in forks)
        return dataclasses.replace(found, forks=tuple(c for c in children if c is not None))

    def waiting_now(self, seq_id: str, now: float) -> WaitNow | None:
        """Why a live request waits now (None: unknown, finished, or not waiting)."""
        track = self._live.get(seq_id)
        if track is None or track.phase is not Phase.WAITING or track.reason is None:
            return None
        hold = track.last
        if track.reason is WaitReason.BEHIND_QUEUE and self._epochs:
            hold = self._epochs[-1].last
        return WaitNow(track.reason, hold, track.ahead, max(0.0, now - track.start))

    def finished_since(self, low: float) -> list[RequestTimeline]:
        """The kept timelines of the requests that finished after ``low``, newest first."""
        found = []
        for timeline, _ in reversed(self._finished.values()):
            if timeline.events[-1].time <= low:
                break
            found.append(timeline)
        return found

    def summary(self, now: float) -> WaitSummary:
        """Where the waiting went, over the window and since the start (open waits included)."""
        low = now - self.window_s
        recent: list[HeldShare] = []
        for start, end, shares in self._recent:
            if end > low:
                recent.extend(_clipped(start, end, shares, low))
        total = [HeldShare(r, s) for r, s in self._waited.items()]
        for track in self._live.values():
            if track.phase is Phase.WAITING and now > track.start:
                shares = self._open(track, now).held_by
                total.extend(shares)
                recent.extend(_clipped(track.start, now, shares, low))
        head = self._head
        held = head.last if head is not None else None
        named = HeadHold(head.seq.seq_id, held) if head is not None and held is not None else None
        return WaitSummary(self.window_s, HeldShare.summed(recent), HeldShare.summed(total), named)

    # -- internals ------------------------------------------------------------------------

    def _decide(self, now: float, head: _Track | None, hold: Hold | None, ahead: Ahead) -> None:
        """Tracks no step saw yet: the head takes its own reason (below), the others wait
        behind it; those admitted meanwhile are already in prefill."""
        behind = [
            t
            for t in self._undecided
            if t is not head
            and t.phase is Phase.WAITING
            and t.seq.status is SequenceStatus.WAITING
            and t.seq.seq_id in self._live
        ]
        self._undecided.clear()
        if not behind:
            return
        for track, n in zip(behind, ahead([t.seq for t in behind]), strict=True):
            self._wait(track, now, WaitReason.BEHIND_QUEUE, hold, n)

    def _preempted(self, track: _Track, now: float, cause: PreemptCause) -> None:
        self._prefilling.pop(track.seq.seq_id, None)
        self._close(track, now)
        track.events.append(TimelineEvent(EventKind.PREEMPTED, now, cause))
        track.phase, track.start, track.reason = Phase.WAITING, now, WaitReason.NEXT_STEP
        track.first = track.last = None
        track.ahead = None
        track.resumed = True
        self._undecided.append(track)

    def _wait(
        self, track: _Track, now: float, reason: WaitReason, hold: Hold | None, ahead: int | None
    ) -> None:
        """Close the track's segment at ``now`` and open a wait for ``reason``."""
        self._close(track, now)
        track.phase, track.start, track.reason = Phase.WAITING, now, reason
        track.first = track.last = hold
        track.ahead = ahead

    def _close(self, track: _Track, now: float) -> None:
        """End the open segment at ``now`` (a segment of no time is dropped)."""
        if now > track.start:
            segment = self._open(track, now)
            track.segments.append(segment)
            if segment.phase is Phase.WAITING:
                self._waits_closed(segment.start, now, segment.held_by)
        else:
            now = track.start  # never before the segment it closes
        track.start = now
        track.chunks = []
        track.first = track.last = None
        track.ahead = None

    def _open(self, track: _Track, end: float | None) -> Segment:
        phase = track.phase
        if phase is Phase.WAITING:
            reason, last = track.reason, track.last
            held = self._shares(track.start, end, reason) if reason is not None else ()
            if reason is WaitReason.BEHIND_QUEUE and self._epochs:
                last = self._epochs[-1].last  # what held the head at its last step
            return Segment(phase, track.start, end, reason, track.first, last, track.ahead, held)
        if phase is Phase.PREFILL:
            return Segment(
                phase, track.start, end, chunks=tuple(track.chunks), resumed=track.resumed
            )
        return Segment(phase, track.start, end)

    def _shares(self, start: float, end: float | None, reason: WaitReason) -> tuple[HeldShare, ...]:
        """A wait's seconds by what held the head: its own reason unless it waited behind the
        head (then the head epochs it overlaps; time no epoch covers stays ``BEHIND_QUEUE``)."""
        if end is None:
            end = self._step_start if self._step_start > start else start
        if reason is not WaitReason.BEHIND_QUEUE:
            return (HeldShare(reason, end - start),)
        upto_end, upto_start = self._until(end), self._until(start)
        by = {r: held - upto_start.get(r, 0.0) for r, held in upto_end.items()}
        by = {r: held for r, held in by.items() if held > 1e-12}
        if (rest := end - start - sum(by.values())) > 1e-12:
            by[WaitReason.BEHIND_QUEUE] = by.get(WaitReason.BEHIND_QUEUE, 0.0) + rest
        return tuple(HeldShare(r, held) for r, held in by.items())

    def _until(self, t: float) -> dict[WaitReason, float]:
        """Seconds by what held the head, from the first epoch kept up to ``t``."""
        i = bisect.bisect_right(self._starts, t) - 1
        return self._epochs[i].until(t) if i >= 0 else {}

    def _waits_closed(self, start: float, end: float, shares: tuple[HeldShare, ...]) -> None:
        waited = self._waited
        for share in shares:
            waited[share.reason] = waited.get(share.reason, 0.0) + share.seconds
        recent = self._recent
        recent.append((start, end, shares))
        while recent[0][1] < end - self.window_s:
            recent.popleft()

    def _held(self, now: float, hold: Hold | None) -> None:
        """The head's hold at this step: the current epoch goes on or a new one starts."""
        current = self._current
        if current is not None:
            if hold is not None and hold.reason is current.first.reason:
                current.last = hold
                return
            current.end = now
            self._current = None
        if hold is not None:
            epochs = self._epochs
            before = epochs[-1].until(now) if epochs else {}
            self._current = epoch = _Epoch(now, hold, before)
            epochs.append(epoch)
            self._starts.append(now)
            if len(epochs) > self._trim_at:
                self._trim()

    def _trim(self) -> None:
        """Drop the epochs every open wait started after."""
        oldest = min(
            (t.start for t in self._live.values() if t.phase is Phase.WAITING),
            default=math.inf,
        )
        epochs = self._epochs
        drop = bisect.bisect_right(self._starts, oldest) - 1
        if drop > 0:  # the epoch holding ``oldest`` stays
            del epochs[:drop], self._starts[:drop]
        self._trim_at = max(_EPOCHS_BEFORE_TRIM, 2 * len(epochs))

    def _aged(self, track: _Track, now: float, events: list[TimelineEvent]) -> None:
        """Its first wait lasts until ``now``: when it passed the aging bound, an ``AGED``
        event goes into ``events`` at that time."""
        if (limit := self.max_wait_s) is not None:
            at = track.seq.arrival_time + limit
            if at < now:
                bisect.insort(events, TimelineEvent(EventKind.AGED, at), key=_event_time)

    def _frozen(self, track: _Track, now: float, finished: bool) -> RequestTimeline:
        segments = list(track.segments)
        events = track.events
        if not finished:
            segments.append(self._open(track, None))
            if not track.admitted:
                events = list(events)
                self._aged(track, now, events)
        seq = track.seq
        return RequestTimeline(
            seq_id=seq.seq_id,
            request_id=seq.request_id,
            arrival_time=seq.arrival_time,
            segments=tuple(segments),
            events=tuple(events),
            finished=finished,
        )


def _clipped(
    start: float, end: float, shares: tuple[HeldShare, ...], low: float
) -> Iterable[HeldShare]:
    """``shares`` of a wait from ``start`` to ``end``, pro rata for its part after ``low``."""
    if start >= low:
        return shares
    part = (end - low) / (end - start)
    return (HeldShare(share.reason, share.seconds * part) for share in shares)


def _event_time(event: TimelineEvent) -> float:
    return event.time
