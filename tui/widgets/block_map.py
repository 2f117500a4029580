"""The KV block map: one cell per block coloured by state, the reserve as a threshold.

The server sends one character per block (``.`` free, ``#`` used, ``c`` cached). When there
are more blocks than cells, each cell stands for several blocks and takes the busiest state
among them (used over cached over free); the legend says how many.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import ClassVar

from textual.content import Content
from textual.reactive import reactive
from textual.style import Style
from textual.widget import Widget

from tui.formatting import coloured, percent
from tui.models import KvStats

STATES = {"#": "used", "c": "cached", ".": "free"}
GLYPHS = {"used": "■", "cached": "■", "free": "·"}
GAUGE = {"used": "█", "cached": "█", "free": "░", "reserve": "┃"}
RANK = {".": 0, "c": 1, "#": 2}
FOOTER_LINES = 4


class BlockMap(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "blockmap--used",
        "blockmap--cached",
        "blockmap--free",
        "blockmap--reserve",
        "blockmap--label",
    }

    kv: reactive[KvStats | None] = reactive(None)
    block_map: reactive[str] = reactive("")

    def on_mount(self) -> None:
        self.border_title = "KV blocks"

    def blocks_per_cell(self, width: int, height: int) -> int:
        cells = max(width, 1) * max(height - FOOTER_LINES, 1)
        return max(1, math.ceil(len(self.block_map) / cells))

    def render(self) -> Content:
        kv = self.kv
        if kv is None:
            return Content.styled("waiting for the server…", "$text-muted")
        width = max(self.content_region.width, 1)
        height = max(self.content_region.height, FOOTER_LINES + 1)
        per_cell = self.blocks_per_cell(width, height)
        styles = {
            state: self.get_visual_style(f"blockmap--{state}", partial=True)
            for state in ("used", "cached", "free", "reserve", "label")
        }
        cells = [
            max(self.block_map[i : i + per_cell], key=lambda ch: RANK.get(ch, 0))
            for i in range(0, len(self.block_map), per_cell)
        ]
        lines: list[Content] = []
        for start in range(0, len(cells), width):
            row = cells[start : start + width]
            lines.append(_runs(row, styles))
        lines.extend(self._footer(kv, width, per_cell, styles))
        return Content("\n").join(lines)

    def _footer(
        self, kv: KvStats, width: int, per_cell: int, styles: dict[str, Style]
    ) -> list[Content]:
        total = max(kv.total, 1)
        gauge = ["free"] * width
        used_end = round(kv.used / total * width)
        cached_end = round((kv.used + kv.cached) / total * width)
        for i in range(width):
            gauge[i] = "used" if i < used_end else "cached" if i < cached_end else "free"
        limit = (kv.total - kv.reserved) / total
        mark = min(width - 1, max(0, round(limit * width)))
        gauge[mark] = "reserve"
        gauge_line = _runs_of([(GAUGE[state], state) for state in gauge], styles)
        counts = Content.assemble(
            "used ",
            (str(kv.used), "bold"),
            " · cached ",
            (str(kv.cached), "bold"),
            " · free ",
            (str(kv.free), "bold"),
        )
        figures = Content.assemble(
            "reserve ",
            (str(kv.reserved), "bold"),
            " · usage ",
            coloured(percent(kv.usage), kv.usage, limit * 0.8, limit),
            " · util ",
            (percent(kv.utilization), "bold"),
        )
        legend = Content.assemble(
            ("■", styles["used"]),
            " used ",
            ("■", styles["cached"]),
            " cached ",
            ("·", styles["free"]),
            " free ",
            ("┃", styles["reserve"]),
            f" limit {kv.total - kv.reserved}/{kv.total}",
            (f" · {per_cell} blocks/cell" if per_cell > 1 else "", styles["label"]),
        )
        return [gauge_line, counts, figures, legend]


def _runs(row: list[str], styles: dict[str, Style]) -> Content:
    cells = [(GLYPHS[state], state) for state in (STATES.get(ch, "free") for ch in row)]
    return _runs_of(cells, styles)


def _runs_of(cells: list[tuple[str, str]], styles: dict[str, Style]) -> Content:
    """Cells (glyph, state) as runs of one state: far fewer spans than one per cell."""
    parts: list[tuple[str, Style]] = []
    for state, run in groupby(cells, key=lambda cell: cell[1]):
        parts.append(("".join(glyph for glyph, _ in run), styles[state]))
    return Content.assemble(*parts)
