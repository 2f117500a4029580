"""One request's timeline (``GET /admin/requests/{id}/timeline``): a bar of its phases over
time, each waiting stretch coloured by its reason, and the list of its transitions with their
times and figures. Times are shown from its arrival (the server's are the engine's clock).

The bar: ``█`` a wait for the request's own reason, ``▒`` a wait behind the queue's head (in
the colour of what held the head most), ``█`` prefill (``▓`` a recompute after a preemption),
``█`` decode; under it ``▲`` marks the first token and ``✕`` each preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tui.formatting import seconds
from tui.models import RequestTimeline, Segment, TimelineEvent
from tui.waits import (
    CLASS_STYLES,
    PHASE_STYLES,
    biggest_first,
    figures_change,
    label,
    reason_style,
    shares_parts,
)
from tui.widgets.keyed_table import Row

EVENT_LABELS = {
    "arrived": "arrived",
    "admitted": "admitted",
    "first_token": "first token",
    "preempted": "preempted",
    "resumed": "resumed",
    "aged": "aged (max_wait_s)",
    "policy_switched": "policy switched",
    "finished": "finished",
}
MARKS = {"first_token": "▲", "preempted": "✕"}
CAUSES = {
    "memory": "memory: the pool ran dry",
    "priority": "priority: a request served earlier took its place",
    "rollback": "rollback: its step failed",
}


@dataclass(frozen=True, slots=True)
class Look:
    """How a segment is drawn: its legend key, the glyph, the colour."""

    key: str
    glyph: str
    style: str


def look(segment: Segment) -> Look:
    if segment.phase == "waiting":
        reason = segment.reason or "waiting"
        if reason == "behind_queue":
            held = biggest_first(segment.held_by)
            by = held[0].reason if held else reason
            return Look(f"behind ({label(by)})", "▒", reason_style(by))
        return Look(label(reason), "█", reason_style(reason))
    style = PHASE_STYLES.get(segment.phase, CLASS_STYLES["other"])
    if segment.phase == "prefill" and segment.resumed:
        return Look("recompute", "▓", style)
    return Look(segment.phase, "█", style)


def end_of(timeline: RequestTimeline, now: float | None) -> float:
    """Where the timeline ends: its last segment's end, or ``now`` while one is open (the
    latest time it names when ``now`` is unknown)."""
    known = [timeline.arrival_time]
    known += [t for seg in timeline.segments for t in (seg.start, seg.end) if t is not None]
    known += [event.time for event in timeline.events]
    last = max(known)
    if timeline.segments and timeline.segments[-1].end is None and now is not None:
        return max(last, now)
    return last


def spans(timeline: RequestTimeline, now: float | None) -> list[tuple[Segment, float, float]]:
    """Each segment with its start and end (an open one ends at ``end_of``)."""
    end = end_of(timeline, now)
    return [(seg, seg.start, end if seg.end is None else seg.end) for seg in timeline.segments]


def cell_widths(durations: Sequence[float], width: int) -> list[int]:
    """Cells per segment, proportional to its time, at least one each (those most over their
    share give cells back when that overflows); all zero when there are more segments than
    cells."""
    if len(durations) > width or not durations:
        return [0] * len(durations)
    total = sum(durations) or 1.0
    exact = [d / total * width for d in durations]
    cells = [max(1, round(x)) for x in exact]
    while sum(cells) > width:  # take a cell from the one most over its share
        i = max((i for i, c in enumerate(cells) if c > 1), key=lambda i: cells[i] - exact[i])
        cells[i] -= 1
    while sum(cells) < width:  # give one to the one most under it
        i = min(range(len(cells)), key=lambda i: cells[i] - exact[i])
        cells[i] += 1
    return cells


class TimelineBar(Widget):
    """The bar, the marks under it and the legend (each kind's seconds)."""

    timeline: reactive[RequestTimeline | None] = reactive(None)
    now: reactive[float | None] = reactive(None)
    """The engine clock's now, estimated from the state (arrival + age): where an open
    segment ends."""

    def render(self) -> Content:
        timeline = self.timeline
        if timeline is None:
            return Content("")
        if not timeline.segments:
            return Content.styled("no segment recorded yet", "$text-muted")
        width = max(self.content_region.width, 10)
        parts = spans(timeline, self.now)
        start, end = timeline.arrival_time, end_of(timeline, self.now)
        cells = cell_widths([b - a for _, a, b in parts], width)
        looks = [look(seg) for seg, _, _ in parts]
        if not any(cells):  # more segments than cells: each cell shows the segment at its middle
            looks = [
                self._at(parts, looks, start + (i + 0.5) * (end - start) / width)
                for i in range(width)
            ]
            cells = [1] * width
        bar = Content.assemble(
            *((lk.glyph * n, lk.style) for lk, n in zip(looks, cells, strict=True) if n)
        )
        marks = [" "] * width
        for event in timeline.events:
            mark = MARKS.get(event.kind)
            if mark is not None and end > start:
                marks[min(width - 1, int((event.time - start) / (end - start) * width))] = mark
        return Content("\n").join(
            [bar, Content.styled("".join(marks), "bold"), self._legend(parts)]
        )

    @staticmethod
    def _at(parts: list[tuple[Segment, float, float]], looks: list[Look], t: float) -> Look:
        for (_, a, b), lk in zip(parts, looks, strict=True):
            if a <= t < b:
                return lk
        return looks[-1]

    @staticmethod
    def _legend(parts: list[tuple[Segment, float, float]]) -> Content:
        totals: dict[Look, float] = {}
        for seg, a, b in parts:
            lk = look(seg)
            totals[lk] = totals.get(lk, 0.0) + (b - a)
        items: list[Content] = []
        for lk, secs in totals.items():
            items.append(Content.assemble((lk.glyph, lk.style), f" {lk.key} {seconds(secs)}"))
        return Content("  ").join(items)


def timeline_summary(timeline: RequestTimeline, now: float | None) -> str:
    """``4.82 s · TTFT 1.20 s · waited 1.05 s · preempted 1×``: the panel's subtitle."""
    end = end_of(timeline, now)
    words = [seconds(end - timeline.arrival_time)]
    first = next((e.time for e in timeline.events if e.kind == "first_token"), None)
    if first is not None:
        words.append(f"TTFT {seconds(first - timeline.arrival_time)}")
    waited = sum(b - a for seg, a, b in spans(timeline, now) if seg.phase == "waiting")
    words.append(f"waited {seconds(waited)}")
    preempted = sum(1 for e in timeline.events if e.kind == "preempted")
    if preempted:
        words.append(f"preempted {preempted}×")
    if timeline.forks:
        words.append(f"{len(timeline.forks)} fork{'s' if len(timeline.forks) > 1 else ''}")
    return " · ".join(words)


TRANSITION_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("at", "At", 9),
    ("for", "For", 8),
    ("what", "What", 22),
    ("detail", "Detail", None),
)


def transition_rows(timeline: RequestTimeline, now: float | None) -> list[Row]:
    """Segments and events in time order (an event before the segment it starts), each with
    its time from arrival."""
    t0 = timeline.arrival_time
    timed: list[tuple[float, int, int, Row]] = []
    for i, event in enumerate(timeline.events):
        timed.append((event.time, 0, i, (f"e{i}", _event_cells(event, t0))))
    for i, (seg, a, b) in enumerate(spans(timeline, now)):
        timed.append((a, 1, i, (f"s{i}", _segment_cells(seg, t0, b - a))))
    return [row for *_, row in sorted(timed, key=lambda item: item[:3])]


def _at(t: float, t0: float) -> Text:
    return Text(f"+{t - t0:.3f}", justify="right")


def _event_cells(event: TimelineEvent, t0: float) -> list[Text]:
    name = EVENT_LABELS.get(event.kind, event.kind.replace("_", " "))
    detail = CAUSES.get(event.cause, event.cause) if event.cause else ""
    detail = detail or event.finish_reason or event.policy or ""
    style = f"bold {CLASS_STYLES['memory']}" if event.kind == "preempted" else "bold"
    return [_at(event.time, t0), Text(""), Text(f"● {name}", style=style), Text(detail)]


def _segment_cells(seg: Segment, t0: float, duration: float) -> list[Text]:
    lk = look(seg)
    open_mark = "…" if seg.end is None else ""
    what = Text.assemble((lk.glyph + " ", lk.style), (_what(seg), lk.style))
    return [
        _at(seg.start, t0),
        Text(seconds(duration) + open_mark, justify="right"),
        what,
        _detail(seg),
    ]


def _what(seg: Segment) -> str:
    if seg.phase == "waiting":
        return f"wait · {label(seg.reason or 'waiting')}"
    if seg.phase == "prefill" and seg.resumed:
        return "prefill (recompute)"
    return seg.phase


def _detail(seg: Segment) -> Text:
    if seg.phase == "waiting":
        if seg.reason == "behind_queue":
            ahead = f"{seg.ahead} ahead" if seg.ahead is not None else ""
            held = shares_parts(seg.held_by)
            if not held:
                return Text(ahead)
            return Text.assemble(ahead + (" · " if ahead else "") + "head held by ", *held)
        first, last = seg.first, seg.last
        return Text(figures_change(first and first.figures, last and last.figures))
    if seg.phase == "prefill" and seg.chunks:
        chunks = "+".join(str(c) for c in seg.chunks)
        steps = len(seg.chunks)
        plural = "s" if steps > 1 else ""
        return Text(f"{sum(seg.chunks)} tokens in {steps} step{plural} ({chunks})")
    return Text("")
