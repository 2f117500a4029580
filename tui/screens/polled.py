"""A full screen whose data comes with the console's chained poll.

While such a screen is on top, each poll fetches its data beside the state and jobs (the
app awaits ``load`` in the same poll, so screen fetches never overlap either, and pause
pauses them too). The screen asks for a poll when it comes on top, so it fills at once, and
shows its own fetch errors: a route the server lacks does not make the whole console stale.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from textual.content import Content
from textual.widgets import Static

from tui.client import ClientError, ConsoleClient
from tui.screens.base import ConsoleScreen
from tui.widgets.status_header import Status, StatusHeader

T = TypeVar("T")


class PolledScreen(ConsoleScreen, Generic[T]):
    data: T | None = None
    error: str | None = None

    async def fetch(self, client: ConsoleClient) -> T:
        """The screen's GETs (one poll's worth)."""
        raise NotImplementedError

    def show_data(self, data: T) -> None:
        raise NotImplementedError

    async def load(self) -> None:
        """Fetch and show; a client error is said on the screen, never raised."""
        try:
            data = await self.fetch(self.console.client)
        except ClientError as exc:
            self.error = str(exc)
            if self.is_attached:
                self.say(f"Could not load: {exc}", "$text-error")
            return
        failed_before, self.data, self.error = self.error is not None, data, None
        if self.is_attached:
            if failed_before:
                self.say("")
            self.show_data(data)

    def show_status(self, status: Status) -> None:
        for header in self.query(StatusHeader):
            header.status = status

    def say(self, text: str, style: str = "") -> None:
        for message in self.query(".screen-message").results(Static):
            message.update(Content.styled(text, style))

    def on_screen_resume(self) -> None:
        self.console.poll()

    def action_close(self) -> None:
        self.app.pop_screen()
