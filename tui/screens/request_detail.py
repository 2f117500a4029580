"""One request: its timeline (``GET /admin/requests/{id}/timeline``: a bar of its phases, each
wait coloured by its reason, and its transitions) and its prompt and output as it streams
(``GET /admin/requests/{id}``), opened with ``d`` (or enter) on the main screen's requests
table. Refreshed by the console's poll; both parts are fetched together and each says for
itself when the server has none.

The server keeps text only when started with ``--expose-text`` (prompts are private by
default); without it the text panels say so and the text is not asked for, while the timeline
(no text in it) still shows. A request whose text or timeline the server has dropped
(finished, older than the last few kept) keeps what was last shown and says why. A server
older than the timelines (no route: 404 ``Not Found``) gets the text alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, TypeVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, Footer, Static

from tui.client import ApiError, ConsoleClient
from tui.models import RequestInfo, RequestText, RequestTimeline
from tui.screens.polled import PolledScreen
from tui.widgets.keyed_table import sync_rows
from tui.widgets.status_header import StatusHeader
from tui.widgets.timeline import (
    TRANSITION_COLUMNS,
    TimelineBar,
    timeline_summary,
    transition_rows,
)

NOT_EXPOSED = (
    "The server keeps no request text: prompts and outputs are private unless it is started "
    "with --expose-text (make run passes it)."
)
NO_TIMELINES = "This server records no timelines (a version older than the wait reasons)."

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Part(Generic[T]):
    """What one poll brought of one part: the value, or why there is none (``note``)."""

    value: T | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class RequestPage:
    text: Part[RequestText]
    timeline: Part[RequestTimeline]


def headline(text: RequestText) -> Content:
    state = (
        Content.styled("running", "bold $text-success")
        if text.state == "running"
        else Content.styled(f"finished ({text.finish_reason or '?'})", "bold")
    )
    parts = [Content.styled(f"Request {text.id}", "bold"), Content(" · "), state]
    if text.request_id and text.request_id != text.id:
        parts.append(Content(f" · of request {text.request_id}"))
    return Content.assemble(*parts)


def size_line(chars: int, truncated: bool, max_chars: int) -> str:
    return f"{chars:,} chars" + (f", first {max_chars:,} kept" if truncated else "")


def timeline_headline(seq_id: str, timeline: RequestTimeline, live: str | None) -> Content:
    """The title from the timeline alone (no text kept): how it finished, or its state now
    (``live``: waiting or running, as the last state listed it)."""
    finish = next((e.finish_reason for e in timeline.events if e.kind == "finished"), None)
    state = (
        Content.styled(f"finished ({finish or '?'})", "bold")
        if timeline.finished
        else Content.styled(live or "live", "bold $text-success")
    )
    parts = [Content.styled(f"Request {seq_id}", "bold"), Content(" · "), state]
    if timeline.request_id and timeline.request_id != seq_id:
        parts.append(Content(f" · of request {timeline.request_id}"))
    return Content.assemble(*parts)


class RequestDetailScreen(PolledScreen[RequestPage]):
    COMMAND_SCOPE = "request"

    def __init__(self, read_only: bool, seq_id: str) -> None:
        super().__init__(read_only)
        self.seq_id = seq_id
        self.text: RequestText | None = None
        """The last text shown (it stays when the server drops it)."""
        self.timeline: RequestTimeline | None = None
        """The last timeline shown (likewise)."""

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status")
        yield Static(f"Request {self.seq_id}", id="request-title", classes="screen-title")
        with Vertical(id="request-timeline", classes="panel") as timeline:
            timeline.border_title = "Timeline"
            yield TimelineBar(id="timeline-bar")
            table: DataTable[Text] = DataTable(id="timeline-transitions", cursor_type="row")
            yield table
            yield Static("", id="timeline-note")
        with VerticalScroll(id="request-prompt", classes="panel request-text") as prompt:
            prompt.border_title = "Prompt"
            yield Static("", id="request-prompt-text", markup=False)
        with VerticalScroll(id="request-output", classes="panel request-text") as output:
            output.border_title = "Output"
            yield Static("", id="request-output-text", markup=False)
        yield Static("", id="request-message", classes="screen-message")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#timeline-transitions", DataTable)
        for key, label, width in TRANSITION_COLUMNS:
            table.add_column(label, key=key, width=width)
        self.query_one("#timeline-bar").display = False
        table.display = False
        self.show_status(self.console.status)

    async def fetch(self, client: ConsoleClient) -> RequestPage:
        text, timeline = await asyncio.gather(
            self._text(client), self._timeline(client), return_exceptions=True
        )
        # both awaited before raising either: no fetch runs on past this poll
        if isinstance(text, BaseException):
            raise text
        if isinstance(timeline, BaseException):
            raise timeline
        return RequestPage(text, timeline)

    async def _text(self, client: ConsoleClient) -> Part[RequestText]:
        snapshot = self.console.snapshot
        if snapshot is not None and not snapshot.state.text_exposed:
            return Part(note=NOT_EXPOSED)
        try:
            return Part(await client.request_text(self.seq_id))
        except ApiError as exc:
            if exc.status == 409:
                return Part(note=NOT_EXPOSED)
            if exc.status == 404:
                kept = "; the last text shown stays" if self.text is not None else ""
                return Part(note=f"The server no longer keeps this request's text{kept}.")
            raise

    async def _timeline(self, client: ConsoleClient) -> Part[RequestTimeline]:
        try:
            return Part(await client.request_timeline(self.seq_id))
        except ApiError as exc:
            if exc.status != 404:
                raise
            if exc.detail == "Not Found":  # the framework's answer: no such route
                return Part(note=NO_TIMELINES)
            kept = "; the last one shown stays" if self.timeline is not None else ""
            return Part(note=f"The server no longer keeps this request's timeline{kept}.")

    def show_data(self, data: RequestPage) -> None:
        if data.timeline.value is not None:
            self.timeline = data.timeline.value
            self._show_timeline(self.timeline)
        note = self.query_one("#timeline-note", Static)
        note.update(Content.styled(data.timeline.note or "", "$text-muted"))
        note.display = data.timeline.note is not None
        if data.text.value is not None:
            self.text = data.text.value
            self._show_text(self.text)
        elif self.text is None and self.timeline is not None:
            row = self._row()
            self.query_one("#request-title", Static).update(
                timeline_headline(self.seq_id, self.timeline, row.state if row else None)
            )
        # no text at all: the timeline takes the room, the message says why
        self.set_class(self.text is None and data.text.note is not None, "-no-text")
        self.say(data.text.note or "", "$text-warning" if data.text.note else "")

    def _row(self) -> RequestInfo | None:
        """The request as the last state listed it (None once it is no longer listed)."""
        snapshot = self.console.snapshot
        if snapshot is None:
            return None
        return next((r for r in snapshot.state.requests if r.id == self.seq_id), None)

    def _now(self) -> float | None:
        """The engine clock's now, from the last state: the request's arrival plus its age
        (None once it is no longer listed: its timeline is then closed)."""
        row = self._row()
        return (
            None if row is None or self.timeline is None else self.timeline.arrival_time + row.age_s
        )

    def _show_timeline(self, timeline: RequestTimeline) -> None:
        now = self._now()
        bar = self.query_one(TimelineBar)
        bar.display = True
        bar.timeline, bar.now = timeline, now
        table = self.query_one("#timeline-transitions", DataTable)
        table.display = True
        # on the last row of a shown timeline: keep following its new transitions
        following = 0 < table.row_count == table.cursor_row + 1
        sync_rows(table, transition_rows(timeline, now))
        if following:
            table.move_cursor(row=table.row_count - 1)
        panel = self.query_one("#request-timeline", Vertical)
        panel.border_subtitle = timeline_summary(timeline, now)

    def _show_text(self, data: RequestText) -> None:
        self.query_one("#request-title", Static).update(headline(data))
        self.query_one("#request-prompt", VerticalScroll).border_subtitle = size_line(
            data.prompt_chars, data.prompt_truncated, data.max_chars
        )
        self.query_one("#request-prompt-text", Static).update(data.prompt)
        output = self.query_one("#request-output", VerticalScroll)
        streaming = " · streaming" if data.state == "running" else ""
        output.border_subtitle = (
            size_line(data.output_chars, data.output_truncated, data.max_chars) + streaming
        )
        following = output.scroll_y >= output.max_scroll_y  # at the end: keep following it
        self.query_one("#request-output-text", Static).update(data.output)
        if following:
            self.call_after_refresh(output.scroll_end, animate=False)
