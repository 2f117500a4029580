"""Where the last window's waiting went (``/admin/state``'s ``waits``): the seconds by what held
the queue's head, the biggest first, what holds the head now, and the tail: how the requests
at or over the window's TTFT p99 spent their waiting. Hidden for a server that does not say
(older than issue 41)."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tui.formatting import seconds
from tui.models import WaitSummary
from tui.waits import biggest_first, figures_text, label, reason_style, shares_text

SHOWN = 4
"""Reasons drawn as bars; the rest are counted on one line."""

EIGHTHS = " ▏▎▍▌▋▊▉"
LABEL_WIDTH = 11
BAR_MAX = 24
"""Cells of the widest bar: the shares and seconds stay near their labels."""


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of ``fraction`` of ``width`` cells, in eighths of a cell."""
    eighths = round(max(0.0, min(fraction, 1.0)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (EIGHTHS[rest] if rest else "")).ljust(width)


class WaitsPanel(Widget):
    summary: reactive[WaitSummary | None] = reactive(None)

    def on_mount(self) -> None:
        self.display = False

    def watch_summary(self, summary: WaitSummary | None) -> None:
        self.display = summary is not None
        if summary is not None:
            self.border_title = f"Waiting ({summary.window_s:g} s)"
            total = sum(share.seconds for share in biggest_first(summary.recent))
            self.border_subtitle = f"{seconds(total)} by what held the head" if total else ""

    def render(self) -> Content:
        summary = self.summary
        if summary is None:
            return Content("")
        width = max(self.content_region.width, 20)
        shares = biggest_first(summary.recent)
        total = sum(share.seconds for share in shares)
        lines: list[Content] = []
        if not shares:
            lines.append(
                Content.styled(f"no waiting in the last {summary.window_s:g} s", "$text-muted")
            )
        bar_width = min(max(width - LABEL_WIDTH - 15, 4), BAR_MAX)
        for share in shares[:SHOWN]:
            fraction = share.seconds / total
            style = reason_style(share.reason)
            lines.append(
                Content.assemble(
                    (f"{label(share.reason):<{LABEL_WIDTH}}", style),
                    (bar(fraction, bar_width), style),
                    f"{fraction:>5.0%}",
                    f"{seconds(share.seconds):>9}",
                )
            )
        if len(shares) > SHOWN:
            rest = shares[SHOWN:]
            left = sum(share.seconds for share in rest)
            more = f"+{len(rest)} more"
            lines.append(
                Content.styled(
                    f"{more:<{LABEL_WIDTH}}{'':{bar_width}}{left / total:>5.0%}{seconds(left):>9}",
                    "$text-muted",
                )
            )
        if summary.head is not None:
            hold = summary.head.hold
            lines.append(
                Content.assemble(
                    ("head ", "bold"),
                    f"{summary.head.seq_id}: ",
                    (label(hold.reason), reason_style(hold.reason)),
                )
            )
            if words := figures_text(hold.figures):
                lines.append(Content(f"  {words}"))
        lines.extend(self._tail(summary))
        return Content("\n").join(lines)

    @staticmethod
    def _tail(summary: WaitSummary) -> list[Content]:
        """Where the slowest requests' waiting went: those finished in the window with a TTFT
        at or over its p99."""
        if summary.tail_ttft_s is None:
            return [Content.styled("tail: nothing finished in the window", "$text-muted")]
        head = Content.assemble(("tail ", "bold"), f"(TTFT ≥ p99 {seconds(summary.tail_ttft_s)})")
        if not biggest_first(summary.tail):
            return [head + Content.styled(" did not wait", "$text-muted")]
        return [head + Content(" waited for"), Content("  ") + shares_text(summary.tail)]
