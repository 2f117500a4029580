"""The fleet's replicas (``servedeck serve --replicas N``): one row each, and the totals.

Absent without a fleet: hidden by the stylesheet until a poll brings a row to show.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from tui.models import AdminState, ReplicaReclaim, ReplicaTotals
from tui.replicas import ReplicaRoster, ReplicaRow
from tui.widgets.keyed_table import Row, sync_rows

COLUMNS: tuple[tuple[str, int], ...] = (
    ("Replica", 9),
    ("State", 9),
    ("PID", 7),
    ("Version", 10),
    ("Wait", 4),
    ("Run", 4),
    ("In-fl", 5),
    ("Free KV", 7),
    ("Gen tok", 8),
    ("Last reclaim", 22),
)
ID_CHARS = 8
NOTE_CHARS = 96


def short_id(replica: str) -> str:
    """Ray's replica ids end in their unique part: keep the end."""
    return replica if len(replica) <= ID_CHARS + 1 else "…" + replica[-ID_CHARS:]


def reclaim_text(run: ReplicaReclaim | None) -> Text:
    if run is None:
        return Text("—", style="dim")
    text = Text(f"freed {run.freed} ev {run.evicted} {run.free_before}→{run.free_after}")
    if run.reserve_breached:
        text.append(" breach", style="yellow")
    return text


def one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= NOTE_CHARS else first[: NOTE_CHARS - 1] + "…"


def row_cells(row: ReplicaRow, in_force: int, now: float, draining: bool = False) -> Row:
    view = row.view

    def num(n: object) -> Text:
        return Text(str(n), justify="right")

    restarted = row.restarted(now)
    if not row.up:
        state = Text("DOWN", style="bold red")
    elif draining:
        state = Text("draining", style="bold yellow")
    elif restarted:
        state = Text("restarted", style="bold cyan")
    else:
        state = Text("up", style="green")
    if row.up:
        behind = view.version is not None and view.version < in_force
        version = Text(
            "—" if view.version is None else f"v{view.version}" + (" behind" if behind else ""),
            style="bold yellow" if behind else "",
        )
        pid = Text(str(view.pid or "—"), style="bold cyan" if restarted else "")
        figures = [num(view.waiting), num(view.running), num(view.in_flight)]
        figures += [num(view.free_blocks), num(view.generation_tokens)]
        reclaim = reclaim_text(view.last_reclaim)
    else:
        dash = Text("—", style="dim", justify="right")
        version, figures, reclaim = Text("—", style="dim"), [dash] * 5, Text("—", style="dim")
        pid = Text(str(row.last_pid or "—"), style="dim")
    return row.key, [Text(short_id(view.replica)), state, pid, version, *figures, reclaim]


def note_text(row: ReplicaRow, now: float) -> Text | None:
    """A line under the table for a row that is down (its error) or just restarted."""
    name = short_id(row.key)
    if not row.up:
        error = one_line(row.view.error or "not answering")
        return Text.assemble((f"{name} DOWN", "bold red"), ": ", (error, "red"))
    if row.restarted(now):
        was = f"replaced {short_id(row.replaced)}, " if row.replaced else ""
        pids = f"pid {row.replaced_pid} → {row.view.pid}"
        return Text.assemble((f"{name} restarted", "bold cyan"), f": {was}{pids}")
    return None


def totals_text(totals: ReplicaTotals | None, in_force: int) -> Text:
    if totals is None:
        return Text("")
    text = Text("total ", style="bold")
    down = totals.replicas - totals.up
    text.append(f"{totals.up}/{totals.replicas} up", style="bold red" if down else "green")
    text.append(f"  waiting {totals.waiting}  running {totals.running}")
    text.append(f"  free KV {totals.free_blocks}  KV used {totals.kv_used}/{totals.kv_total}")
    text.append(f" cached {totals.kv_cached}  gen tok {totals.generation_tokens}  versions ")
    mixed = any(v != in_force for v in totals.versions)
    versions = ",".join(f"v{v}" for v in totals.versions) or "—"
    text.append(versions, style="bold yellow" if mixed else "")
    return text


class ReplicaPanel(Vertical):
    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.roster = ReplicaRoster()
        self.rows: Sequence[ReplicaRow] = ()
        self.border_title = "Replicas"

    def compose(self) -> ComposeResult:
        table = DataTable[Text](id="replica-table", cursor_type="row", zebra_stripes=True)
        for label, width in COLUMNS:
            table.add_column(label, key=label, width=width)
        yield table
        yield Static(id="replica-notes")
        yield Static(id="replica-totals")

    def show(self, state: AdminState, now: float) -> None:
        """Fold this poll's replicas in and redraw; hidden while there is none to show."""
        self.rows = self.roster.update(state.replicas, now)
        self.display = bool(self.rows)
        if not self.rows:
            return
        table = self.query_one(DataTable)
        draining = state.draining_replicas()
        cells = [row_cells(row, state.version, now, row.key in draining) for row in self.rows]
        sync_rows(table, cells)
        notes = [n for n in (note_text(row, now) for row in self.rows) if n is not None]
        self.query_one("#replica-notes", Static).update(Text("\n").join(notes))
        self.query_one("#replica-notes", Static).display = bool(notes)
        self.query_one("#replica-totals", Static).update(
            totals_text(state.replica_totals, state.version)
        )
        down = sum(not row.up for row in self.rows)
        title = f"Replicas · {len(self.rows) - down}/{len(self.rows)} up"
        title += f" · in force v{state.version}"
        restart = state.restart
        if restart is not None and restart.state == "running":
            title += f" · rolling restart {len(restart.started)}/{len(restart.replicas)}"
        self.border_title = title

    def focus_table(self) -> bool:
        """Focus the rows (False when there is no fleet to show)."""
        if not self.display:
            return False
        self.query_one(DataTable).focus()
        return True
