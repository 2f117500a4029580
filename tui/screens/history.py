"""Every stored policy version, newest first, with what changed and a rollback."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import DataTable, Footer, Static

from tui.client import ClientError, Conflict
from tui.formatting import clock_time
from tui.models import FieldChange, HistoryPage, PolicySettings, PolicyVersion
from tui.screens.base import ConsoleScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.policy_editor import diff_content

PAGE = 50


def flatten(settings: PolicySettings | None) -> dict[str, Any]:
    if settings is None:
        return {}
    flat: dict[str, Any] = {"policy.name": settings.policy.name}
    flat.update({f"policy.params.{k}": v for k, v in settings.policy.params.items()})
    flat["memory_reserve"] = settings.memory_reserve
    flat["reclaim_interval_s"] = settings.reclaim_interval_s
    return flat


def settings_diff(before: PolicySettings | None, after: PolicySettings | None) -> list[FieldChange]:
    old, new = flatten(before), flatten(after)
    return [
        FieldChange(field=key, before=old.get(key), after=new.get(key))
        for key in dict.fromkeys([*old, *new])
        if old.get(key) != new.get(key)
    ]


STATE_STYLES = {"applied": "$text-success", "pending": "$text-warning", "failed": "$text-error"}


def status_content(version: PolicyVersion) -> Content:
    """The version's state (pending, applied, failed) and why; nothing from older servers."""
    status = version.status
    if status is None:
        return Content("")
    why = f": {status.state_reason}" if status.state_reason else ""
    return Content.styled(f"{status.state}{why}\n", STATE_STYLES.get(status.state, ""))


class HistoryScreen(ConsoleScreen):
    COMMAND_SCOPE = "history"

    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.page = HistoryPage()
        self.active: int | None = None

    def compose(self) -> ComposeResult:
        yield Static("Policy history", id="history-title")
        with Horizontal(id="history-body"):
            table: DataTable[Text] = DataTable(id="history-table", cursor_type="row")
            table.border_title = "Versions"
            yield table
            detail = Static("", id="history-detail")
            detail.border_title = "Change"
            yield detail
        yield Static("", id="history-message")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in (
            ("version", "Ver"),
            ("at", "Time"),
            ("actor", "Actor"),
            ("policy", "Policy"),
            ("reason", "Reason"),
        ):
            table.add_column(label, key=key)
        self.action_reload()

    def action_reload(self) -> None:
        self.run_worker(self._load(), group="history", exclusive=True)

    def action_close(self) -> None:
        self.app.pop_screen()

    async def _load(self) -> None:
        client = self.console.client
        try:
            self.page = await client.history(0, PAGE)
            self.active = (await client.policy()).version
        except ClientError as exc:
            self.say(f"Could not load the history: {exc}", "$text-error")
            return
        table = self.query_one(DataTable)
        table.clear()
        for item in self.page.items:
            label = f"v{item.version}" + (" ●" if item.version == self.active else "")
            if item.status is not None and item.status.state != "applied":
                label += f" {item.status.state}"
            note = f" (rollback of v{item.rollback_of})" if item.rollback_of else ""
            cells = (
                label,
                clock_time(item.created_at),
                item.actor or "—",
                item.settings.policy.name,
                (item.reason or "") + note,
            )
            table.add_row(*(Text(cell) for cell in cells), key=str(item.version))
        shown = len(self.page.items)
        self.query_one("#history-title", Static).update(
            f"Policy history · {shown} of {self.page.total} versions · active v{self.active}"
        )
        if shown:
            self._show_detail(self.page.items[0])

    def selected(self) -> PolicyVersion | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((v for v in self.page.items if str(v.version) == key), None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        version = self.selected()
        if version is not None:
            self._show_detail(version)

    def _show_detail(self, version: PolicyVersion) -> None:
        params = " ".join(f"{k}={v}" for k, v in version.settings.policy.params.items())
        head = Content.assemble(
            (f"v{version.version}", "bold"),
            f" {version.settings.policy.name} {params or '(default params)'}\n",
            f"reserve {version.settings.memory_reserve} · "
            f"reclaim every {version.settings.reclaim_interval_s:g}s\n",
            (f"{version.created_at or ''} by {version.actor or '—'}\n", "$text-muted"),
            status_content(version),
            "\n",
        )
        change = settings_diff(version.before, version.after or version.settings)
        tail = (
            Content.styled("\nr roll back to this version", "$text-muted")
            if not self.read_only and version.version != self.active
            else Content("")
        )
        self.query_one("#history-detail", Static).update(head + diff_content(change) + tail)

    def say(self, text: str, style: str = "") -> None:
        self.query_one("#history-message", Static).update(Content.styled(text, style))

    def action_rollback(self) -> None:
        self.run_worker(self._rollback(), group="history", exclusive=True)

    async def _rollback(self) -> None:
        target = self.selected()
        if target is None or self.active is None:
            return
        if target.version == self.active:
            self.say(f"Version {target.version} is already active.", "$text-warning")
            return
        current = next((v for v in self.page.items if v.version == self.active), None)
        change = settings_diff(current.settings if current else None, target.settings)
        reason = await self.app.push_screen_wait(
            ConfirmScreen(
                f"Roll back to version {target.version}? (stored as a new version)",
                diff_content(change),
                "Roll back",
                reason=f"rollback to v{target.version}",
                reason_required=True,
            )
        )
        if reason is None:
            self.say("Not rolled back.", "$text-warning")
            return
        try:
            result = await self.console.client.rollback(
                target.version, reason, if_match=self.active
            )
        except Conflict as exc:
            self.say(f"Conflict: {exc.message}. Nothing was changed.", "bold $text-error")
            return
        except ClientError as exc:
            self.say(f"Rollback refused: {exc}", "$text-error")
            return
        await self._load()
        self.say(
            f"Rolled back: version {result.version} copies version {target.version}.",
            "bold $text-success",
        )
        self.console.poll()
