"""Running and waiting requests, updated in place so the cursor stays on its request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from tui.models import RequestInfo
from tui.waits import BEHIND, held_reason, reason_style, wait_label

COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("id", "Request", 15),
    ("state", "State", 8),
    ("wait", "Wait", 11),  # why it waits now: its reason, or ↳ what holds the queue's head
    ("wait_s", "Wait s", 6),  # seconds in this wait
    ("tenant", "Tenant", 10),
    ("priority", "Prio", 5),  # lower is served earlier (a schedule's priority: higher wins)
    ("prompt_tokens", "Prompt", 6),
    ("generated_tokens", "Gen", 5),
    ("blocks", "Blk", 5),
    ("age_s", "Age s", 6),
    ("preemptions", "Preempt", 7),
)
COLUMN_KEYS = tuple(key for key, _, _ in COLUMNS)


@dataclass(frozen=True, order=True, slots=True)
class Cell:
    """A table cell that sorts by its value (ties broken by request id) and shows its text."""

    value: float | str
    tiebreak: str
    text: str
    right: bool = field(default=True, compare=False)
    style: str = field(default="", compare=False)

    def __rich__(self) -> Text:
        return Text(
            self.text, style=self.style, justify="right" if self.right else "left", no_wrap=True
        )


def wait_cells(request: RequestInfo) -> tuple[Cell, Cell]:
    """Its wait's label (coloured by what holds it) and seconds; empty when it does not wait
    or the server does not say (older than issue 41). Those sort after every waiting one."""
    rid, wait = request.id, request.wait
    if wait is None:
        return Cell("", rid, "", right=False), Cell(-1.0, rid, "")
    text = wait_label(wait)
    return (
        Cell(text, rid, text, right=False, style=reason_style(held_reason(wait))),
        Cell(wait.seconds, rid, f"{wait.seconds:.1f}"),
    )


def cells_for(request: RequestInfo) -> dict[str, Cell]:
    rid = request.id
    wait, wait_s = wait_cells(request)
    return {
        "id": Cell(rid, rid, rid, right=False),
        "state": Cell(request.state, rid, request.state, right=False),
        "wait": wait,
        "wait_s": wait_s,
        "tenant": Cell(request.tenant, rid, request.tenant, right=False),
        "priority": Cell(request.priority, rid, str(request.priority)),
        "prompt_tokens": Cell(request.prompt_tokens, rid, str(request.prompt_tokens)),
        "generated_tokens": Cell(request.generated_tokens, rid, str(request.generated_tokens)),
        "blocks": Cell(request.blocks, rid, str(request.blocks)),
        "age_s": Cell(request.age_s, rid, f"{request.age_s:.1f}"),
        "preemptions": Cell(request.preemptions, rid, str(request.preemptions)),
    }


class RequestTable(DataTable[Cell]):
    sort_column: reactive[str] = reactive("age_s")
    sort_reverse: reactive[bool] = reactive(True)
    filter_text: reactive[str] = reactive("")

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id, classes=classes)
        self._requests: Sequence[RequestInfo] = ()
        self.total = 0

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)
        self._retitle()

    def show(self, requests: Sequence[RequestInfo]) -> None:
        self._requests = requests
        self._sync()

    def matches(self, request: RequestInfo) -> bool:
        needle = self.filter_text.strip().lower()
        wait = "" if request.wait is None else f"{wait_label(request.wait)} {request.wait.reason}"
        fields = (request.id, request.state, request.tenant, wait)
        return not needle or any(needle in f.lower() for f in fields)

    def _sync(self) -> None:
        selected = self._selected_key()
        wanted = {r.id: r for r in self._requests if self.matches(r)}
        for row_key in list(self.rows):
            if row_key.value not in wanted:
                self.remove_row(row_key)
        for rid, request in wanted.items():
            cells = cells_for(request)
            if rid in self.rows:
                for column, cell in cells.items():
                    if self.get_cell(rid, column) != cell:
                        self.update_cell(rid, column, cell)
            else:
                self.add_row(*(cells[k] for k in COLUMN_KEYS), key=rid)
        self.total = len(self._requests)
        self.sort(self.sort_column, reverse=self.sort_reverse)
        if selected is not None and selected in self.rows:
            self.move_cursor(row=self.get_row_index(selected), animate=False, scroll=False)
        self._retitle()

    def selected_id(self) -> str | None:
        """The id of the request under the cursor (None when the table is empty)."""
        return self._selected_key()

    def _selected_key(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def _retitle(self) -> None:
        label = dict((k, lbl) for k, lbl, _ in COLUMNS)[self.sort_column]
        arrow = "↓" if self.sort_reverse else "↑"
        shown = f"{self.row_count} of {self.total}" if self.filter_text else f"{self.total}"
        title = f"Requests {shown} · by {label} {arrow}"
        if self.filter_text:
            title += f" · filter “{self.filter_text}”"
        self.border_title = title
        self.border_subtitle = f"{BEHIND}: behind the queue's head · Prio: lower is served first"

    def watch_filter_text(self) -> None:
        if self.is_mounted:
            self._sync()

    def watch_sort_column(self) -> None:
        if self.is_mounted:
            self._sync()

    def watch_sort_reverse(self) -> None:
        if self.is_mounted:
            self._sync()

    def cycle_sort(self) -> None:
        i = COLUMN_KEYS.index(self.sort_column)
        self.sort_column = COLUMN_KEYS[(i + 1) % len(COLUMN_KEYS)]

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        column = event.column_key.value or "id"
        if column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column = column
