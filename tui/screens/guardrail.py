"""The SLO guardrail (``GET /admin/guardrail``, ``GET /admin/guardrail/decisions``): its mode,
objectives and bounds, whether it evaluates (or why not), the observed margin, and its last
decisions with their reason and prediction error. ``k`` is the kill switch: after a
confirmation it PUTs the config back with mode ``off`` and the reason given."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import DataTable, Footer, Static

from tui.client import ClientError, ConsoleClient
from tui.formatting import clock_time
from tui.models import DecisionList, GuardrailView
from tui.screens.confirm import ConfirmScreen
from tui.screens.polled import PolledScreen
from tui.widgets.guardrail_panels import (
    bounds_panel,
    config_panel,
    decision_cells,
    decision_detail,
    mode_content,
    status_panel,
)
from tui.widgets.keyed_table import selected_key, sync_rows
from tui.widgets.status_header import StatusHeader

DECISIONS = 10
COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("id", "Id", None),
    ("at", "At", None),
    ("outcome", "Outcome", None),
    ("version", "Ver", None),
    ("ttft", "TTFT p99 pred → obs", None),
    ("tpot", "TPOT p99 pred → obs", None),
    ("rate", "tok/s pred → obs", None),
    ("reason", "Reason", 18),
)
"""Key, label, width (None: as wide as its cells); the reason is cut, the detail has it all."""
KILL_REASON = "kill switch from the console"


@dataclass(frozen=True, slots=True)
class GuardrailPage:
    view: GuardrailView
    decisions: DecisionList


class GuardrailScreen(PolledScreen[GuardrailPage]):
    COMMAND_SCOPE = "guardrail"

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status")
        yield Static("Guardrail", id="guardrail-title", classes="screen-title")
        with Horizontal(id="guardrail-top"):
            for name, title in (
                ("config", "Objectives"),
                ("bounds", "Bounds"),
                ("status", "Status"),
            ):
                panel = Static("", id=f"guardrail-{name}", classes="panel")
                panel.border_title = title
                yield panel
        table: DataTable[Text] = DataTable(id="guardrail-decisions", cursor_type="row")
        table.border_title = f"Last {DECISIONS} decisions (proposed changes)"
        yield table
        yield Static("", id="guardrail-detail")
        yield Static("", id="guardrail-message", classes="screen-message")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        self.show_status(self.console.status)
        if not self.read_only:
            self.query_one("#guardrail-status").border_subtitle = "k kill switch"

    async def fetch(self, client: ConsoleClient) -> GuardrailPage:
        view, decisions = await asyncio.gather(
            client.guardrail(), client.guardrail_decisions(DECISIONS)
        )
        return GuardrailPage(view, decisions)

    def show_data(self, data: GuardrailPage) -> None:
        view = data.view
        by = f" by {view.actor}" if view.actor else ""
        stored = (
            f"revision {view.revision}{by} at {clock_time(view.updated_at)}: {view.reason}"
            if view.revision
            else "defaults (never stored)"
        )
        self.query_one("#guardrail-title", Static).update(
            Content.assemble("Guardrail · mode ", mode_content(view.config.mode), f" · {stored}")
        )
        self.query_one("#guardrail-config", Static).update(config_panel(view.config))
        self.query_one("#guardrail-bounds", Static).update(bounds_panel(view.config))
        self.query_one("#guardrail-status", Static).update(status_panel(view.status))
        rows = [(str(d.id), decision_cells(d)) for d in data.decisions.items]
        sync_rows(self.query_one(DataTable), rows)
        self._show_detail()

    def _show_detail(self) -> None:
        key = selected_key(self.query_one(DataTable))
        items = self.data.decisions.items if self.data is not None else []
        chosen = next((d for d in items if str(d.id) == key), None)
        empty = Content.styled("No decisions yet: a decision is a proposed change.", "$text-muted")
        self.query_one("#guardrail-detail", Static).update(
            decision_detail(chosen) if chosen else empty
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    # -- the kill switch -----------------------------------------------------------------

    def action_kill_switch(self) -> None:
        self.run_worker(self._kill(), group="kill", exclusive=True)

    async def _kill(self) -> None:
        shown = self.data.view if self.data is not None else None
        if shown is not None and shown.config.mode == "off":
            self.say("The guardrail is off already.", "$text-warning")
            return
        mode = shown.config.mode if shown is not None else "?"
        reason = await self.app.push_screen_wait(
            ConfirmScreen(
                "Turn the guardrail off? (kill switch)",
                f"Mode {mode} → off. It stops evaluating and changes no setting until a person "
                "sets its mode again; the setting in force stays as it is.",
                "Turn off",
                reason=KILL_REASON,
                reason_required=True,
            )
        )
        if reason is None:
            self.say("Left as it is.", "$text-warning")
            return
        client = self.console.client
        try:
            view = await client.guardrail()  # the config as stored now, sent back whole
            body = {**view.config.model_dump(exclude_unset=True), "mode": "off", "reason": reason}
            after = await client.update_guardrail(body)
        except ClientError as exc:
            self.say(f"Kill switch refused: {exc}", "bold $text-error")
            return
        self.say(
            f"Guardrail off (revision {after.revision}); it changes nothing until turned on.",
            "bold $text-success",
        )
        self.console.poll()
