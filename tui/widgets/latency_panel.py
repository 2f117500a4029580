"""TTFT, TPOT and end-to-end percentiles, each coloured against its thresholds."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tui.formatting import coloured, seconds
from tui.models import Latency, Percentiles

Thresholds = dict[str, tuple[float, float]]
"""Metric name → (warn, crit) in seconds."""


class LatencyPanel(Widget):
    latency: reactive[Latency | None] = reactive(None)

    def __init__(
        self, thresholds: Thresholds, *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.thresholds = thresholds

    def on_mount(self) -> None:
        self.border_title = "Latency (60 s)"

    def render(self) -> Content:
        latency = self.latency or Latency()
        rows = [Content.styled(f"{'':6}{'p50':>9}{'p95':>9}{'p99':>9}", "bold")]
        for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")):
            values: Percentiles = getattr(latency, name)
            warn, crit = self.thresholds[name]
            cells = [
                coloured(f"{seconds(v):>9}", v, warn, crit)
                for v in (values.p50, values.p95, values.p99)
            ]
            rows.append(Content.assemble((f"{label:6}", "bold"), *cells))
        return Content("\n").join(rows)
