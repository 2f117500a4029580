"""Policy windows (``GET /admin/schedules``): each schedule, its next firing in its own zone
and in UTC, and the window in force now. Refreshed by the console's poll."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import DataTable, Footer, Static

from tui.client import ConsoleClient
from tui.formatting import policy_text
from tui.models import Schedule, ScheduleList
from tui.screens.polled import PolledScreen
from tui.widgets.keyed_table import selected_key, sync_rows
from tui.widgets.status_header import StatusHeader

COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("id", "Id", 4),
    ("window", "Cron → until", None),
    ("zone", "Zone", None),
    ("policy", "Policy", 28),
    ("priority", "Prio", 4),
    ("next_local", "Next firing (zone)", None),
    ("next_utc", "Next (UTC)", None),
)
"""Key, label, width (None: as wide as its cells); the policy is cut, the detail has it all."""


def moment(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def in_zone(iso: str | None, zone: str, with_zone: bool = True) -> str:
    """``2026-11-30T00:00:00Z`` in ``Europe/Berlin`` → ``Mon 30 Nov 01:00 CET``; the UTC time
    with its zone named when this machine does not know the zone."""
    at = moment(iso)
    if at is None:
        return "—"
    try:
        at = at.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return at.strftime("%a %d %b %H:%M UTC") + f" ({zone}?)"
    return at.strftime("%a %d %b %H:%M %Z" if with_zone else "%d %b %H:%M")


def setting_text(schedule: Schedule) -> str:
    return policy_text(schedule.policy.name, schedule.policy.params, schedule.memory_reserve)


def cron_text(schedule: Schedule) -> str:
    seconds = f" s={schedule.cron_seconds}" if schedule.cron_seconds else ""
    return schedule.cron + seconds


def row_cells(schedule: Schedule, active: bool) -> list[Text]:
    """The schedule whose window is in force is marked ● (and named above the table)."""
    return [
        Text(
            f"● {schedule.id}" if active else str(schedule.id), style="bold green" if active else ""
        ),
        Text(f"{cron_text(schedule)} → {schedule.until}"),
        Text(schedule.timezone),
        Text(setting_text(schedule), overflow="ellipsis", no_wrap=True),
        Text(str(schedule.priority), justify="right"),
        Text(in_zone(schedule.next_run_at, schedule.timezone)),
        Text(in_zone(schedule.next_run_at, "UTC", with_zone=False)),
    ]


def window_line(schedules: ScheduleList) -> Content:
    """Which window is in force now, since when and until when (its own zone's wall time)."""
    active = next((s for s in schedules.items if s.id == schedules.active), None)
    if active is None:
        return Content.styled("No window in force: the setting is the stored one.", "$text-muted")
    since = in_zone(active.window_start, active.timezone)
    return Content.assemble(
        ("Window in force: ", "bold"),
        (f"schedule {active.id}", "bold $text-success"),
        f" ({setting_text(active)}) since {since}, until {active.until} {active.timezone}",
        f"; applied as version {active.applied_version}" if active.applied_version else "",
    )


def detail(schedule: Schedule) -> Content:
    lines = [
        Content.assemble(
            (f"schedule {schedule.id}", "bold"),
            f"  {cron_text(schedule)} until {schedule.until} ({schedule.timezone})"
            f"  priority {schedule.priority} (high wins)  by {schedule.actor or '—'}",
        ),
        Content(f"policy {setting_text(schedule)}"),
        Content(f"reason: {schedule.reason}"),
    ]
    if schedule.last_end_at:
        last = f"last end {in_zone(schedule.last_end_at, schedule.timezone)}"
        lines.append(Content.styled(f"{last}: {schedule.last_end or '—'}", "$text-muted"))
    return Content("\n").join(lines)


class SchedulesScreen(PolledScreen[ScheduleList]):
    COMMAND_SCOPE = "schedules"

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status")
        yield Static("Schedules", id="schedules-title", classes="screen-title")
        yield Static("", id="schedules-window")
        table: DataTable[Text] = DataTable(id="schedules-table", cursor_type="row")
        table.border_title = "Policy windows"
        table.border_subtitle = "Prio: higher wins an overlap"
        yield table
        yield Static("", id="schedules-detail")
        yield Static("", id="schedules-message", classes="screen-message")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        self.show_status(self.console.status)

    async def fetch(self, client: ConsoleClient) -> ScheduleList:
        return await client.schedules()

    def show_data(self, data: ScheduleList) -> None:
        count = len(data.items)
        self.query_one("#schedules-title", Static).update(
            f"Schedules · {count} stored · overlaps: higher priority, then latest start"
        )
        self.query_one("#schedules-window", Static).update(window_line(data))
        rows = [(str(s.id), row_cells(s, s.id == data.active)) for s in data.items]
        sync_rows(self.query_one(DataTable), rows)
        if not count:
            self.say("No schedules: `servedeck schedule create -f FILE` or POST /admin/schedules.")
        self._show_detail()

    def _show_detail(self) -> None:
        key = selected_key(self.query_one(DataTable))
        items = self.data.items if self.data is not None else []
        chosen = next((s for s in items if str(s.id) == key), None)
        self.query_one("#schedules-detail", Static).update(
            detail(chosen) if chosen else Content("")
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()
