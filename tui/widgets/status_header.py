"""The top line: where we are connected, whether the picture is live, and what runs there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tui.formatting import duration

Connection = Literal["connecting", "live", "stale", "refused"]


@dataclass(frozen=True, slots=True)
class Status:
    url: str
    connection: Connection = "connecting"
    detail: str = ""
    silent_s: float | None = None
    """Seconds since the last good answer (while stale)."""
    policy: str | None = None
    version: int | None = None
    uptime_s: float | None = None
    paused: bool = False
    refresh_s: float = 1.0
    read_only: bool = False


class StatusHeader(Widget):
    status: reactive[Status] = reactive(Status(url=""), layout=True)

    def watch_status(self, status: Status) -> None:
        self.set_class(status.connection == "stale", "-stale")
        self.set_class(status.connection in ("connecting", "refused"), "-down")

    def render(self) -> Content:
        s = self.status
        marks = {
            "live": ("● live", "$text-success"),
            "connecting": ("◌ connecting", "$text-warning"),
            "stale": ("▲ STALE", "$text-error"),
            "refused": ("✖ refused", "$text-error"),
        }
        mark, mark_style = marks[s.connection]
        policy = f"{s.policy} v{s.version}" if s.policy is not None else "—"
        uptime = duration(s.uptime_s) if s.uptime_s is not None else "—"
        poll = "paused" if s.paused else f"every {s.refresh_s:g}s"
        line = Content.assemble(
            ("servedeck ", "bold"),
            (s.url, "underline"),
            "  ",
            (mark, f"bold {mark_style}"),
            "  policy ",
            (policy, "bold"),
            "  up ",
            (uptime, "bold"),
            "  poll ",
            (poll, "bold $text-warning" if s.paused else "bold"),
            ("  read-only" if s.read_only else "", "bold $text-accent"),
        )
        if s.connection == "stale":
            since = f"{s.silent_s:.0f}s" if s.silent_s is not None else "a while"
            warning = Content.styled(
                f"No answer for {since} ({s.detail}). Showing the last picture; "
                "reconnecting by itself.",
                "$text-error",
            )
            return Content("\n").join([line, warning])
        if s.connection in ("connecting", "refused") and s.detail:
            return Content("\n").join([line, Content.styled(s.detail, "$text-error")])
        return line
