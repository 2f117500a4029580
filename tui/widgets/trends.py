"""Sparklines of output tokens/s, queue depth and KV usage over the last polls."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Label, Sparkline

from tui.models import AdminState


@dataclass(slots=True)
class Trend:
    label: str
    unit: str
    points: deque[float] = field(default_factory=deque)
    digits: int = 1

    def text(self) -> str:
        if not self.points:
            return f"{self.label}  —"
        now, peak = self.points[-1], max(self.points)
        d = self.digits
        return f"{self.label}  {now:.{d}f}{self.unit}  (max {peak:.{d}f}{self.unit})"


class TrendHistory:
    """The samples behind the sparklines; kept by the app so a hidden screen misses none."""

    def __init__(self, size: int) -> None:
        self.trends = {
            "tokens": Trend("output tokens/s", "", deque(maxlen=size)),
            "queue": Trend("queue depth", "", deque(maxlen=size), digits=0),
            "kv": Trend("KV usage", "%", deque(maxlen=size)),
        }

    def push(self, state: AdminState) -> None:
        self.trends["tokens"].points.append(state.throughput.output_tokens_per_s)
        self.trends["queue"].points.append(float(state.queue.waiting + state.queue.running))
        self.trends["kv"].points.append(state.kv.usage * 100)

    def __iter__(self) -> Iterator[tuple[str, Trend]]:
        return iter(self.trends.items())


class TrendsPanel(Widget):
    def compose(self) -> ComposeResult:
        for key in ("tokens", "queue", "kv"):
            with Vertical(classes="trend"):
                yield Label(id=f"trend-{key}-label", classes="trend-label")
                yield Sparkline([], id=f"trend-{key}")

    def on_mount(self) -> None:
        self.border_title = "Trends"

    def show(self, history: TrendHistory) -> None:
        for key, trend in history:
            self.query_one(f"#trend-{key}-label", Label).update(trend.text())
            self.query_one(f"#trend-{key}", Sparkline).data = list(trend.points)
