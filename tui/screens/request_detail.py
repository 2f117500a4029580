"""One request's prompt and its output as it streams (``GET /admin/requests/{id}``), opened
with ``d`` (or enter) on the main screen's requests table. Refreshed by the console's poll.

The server keeps text only when started with ``--expose-text`` (prompts are private by
default); without it the screen says so and asks for nothing. A request whose text the server
has dropped (finished, older than the last few) keeps what was last shown and says why.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Footer, Static

from tui.client import ApiError, ClientError, ConsoleClient
from tui.models import RequestText
from tui.screens.polled import PolledScreen
from tui.widgets.status_header import StatusHeader

NOT_EXPOSED = (
    "The server keeps no request text: prompts and outputs are private unless it is started "
    "with --expose-text (make run passes it)."
)


class TextNotKept(ClientError):
    """The server keeps no text for this request: not exposed, or dropped since."""


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


class RequestDetailScreen(PolledScreen[RequestText]):
    COMMAND_SCOPE = "request"

    def __init__(self, read_only: bool, seq_id: str) -> None:
        super().__init__(read_only)
        self.seq_id = seq_id

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status")
        yield Static(f"Request {self.seq_id}", id="request-title", classes="screen-title")
        with VerticalScroll(id="request-prompt", classes="panel request-text") as prompt:
            prompt.border_title = "Prompt"
            yield Static("", id="request-prompt-text", markup=False)
        with VerticalScroll(id="request-output", classes="panel request-text") as output:
            output.border_title = "Output"
            yield Static("", id="request-output-text", markup=False)
        yield Static("", id="request-message", classes="screen-message")
        yield Footer()

    def on_mount(self) -> None:
        self.show_status(self.console.status)

    async def fetch(self, client: ConsoleClient) -> RequestText:
        snapshot = self.console.snapshot
        if snapshot is not None and not snapshot.state.text_exposed:
            raise TextNotKept(NOT_EXPOSED)
        try:
            return await client.request_text(self.seq_id)
        except ApiError as exc:
            if exc.status == 409:
                raise TextNotKept(NOT_EXPOSED) from exc
            if exc.status == 404:
                kept = "; the last text shown stays" if self.data is not None else ""
                raise TextNotKept(f"The server no longer keeps this request's text{kept}.") from exc
            raise

    def show_data(self, data: RequestText) -> None:
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
