"""A DataTable refreshed by key: cells change in place, so the cursor stays on its row."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

Row = tuple[str, Sequence[Text]]
"""A row's key and its cells, in column order."""


def selected_key(table: DataTable[Text]) -> str | None:
    if not table.row_count:
        return None
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


def sync_rows(table: DataTable[Text], rows: Sequence[Row]) -> None:
    """Show ``rows`` in order. Same keys as shown: only changed cells are updated; otherwise
    the table is rebuilt and the cursor put back on the row it was on, if that is still there."""
    keys = [key for key, _ in rows]
    if [row.value for row in table.rows] == keys:
        for key, cells in rows:
            for column, cell in zip(table.columns, cells, strict=True):
                if table.get_cell(key, column) != cell:
                    table.update_cell(key, column, cell)
        return
    was = selected_key(table)
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if was in keys:
        table.move_cursor(row=keys.index(was))
