"""Tenants (``/admin/state.tenants``): each one's share of the service against its weight's
share, its requests waiting and running, its refusals and its virtual token counter, under the
queue discipline in force (docs/fairness.md). The most served first, ``TENANT_ROWS`` of them."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Footer, Static

from tui.client import ConsoleClient
from tui.models import AdminState, TenantInfo
from tui.screens.polled import PolledScreen
from tui.widgets.keyed_table import sync_rows
from tui.widgets.status_header import StatusHeader

TENANT_ROWS = 32
COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "Tenant"),
    ("share", "Service share"),
    ("weight", "Weight share"),
    ("waiting", "Waiting"),
    ("running", "Running"),
    ("refused", "Refused"),
    ("counter", "Counter"),
)


@dataclass(frozen=True, slots=True)
class Share:
    tenant: TenantInfo
    service_share: float
    """Its weighted service over every tenant's (0..1)."""
    weight_share: float
    """Its weight over every tenant's weight (0..1)."""


def shares(tenants: list[TenantInfo]) -> list[Share]:
    """Every tenant's share of service and of weight, the most served first."""
    service = sum(t.service for t in tenants)
    weight = sum(t.weight for t in tenants)
    rows = [
        Share(t, t.service / service if service else 0.0, t.weight / weight if weight else 0.0)
        for t in tenants
    ]
    return sorted(rows, key=lambda s: (-s.tenant.service, s.tenant.name))


def _cells(share: Share) -> list[Text]:
    t = share.tenant
    over = share.service_share > share.weight_share + 0.05 and t.waiting
    return [
        Text(t.name),
        Text(f"{share.service_share:6.1%}", style="bold" if over else "", justify="right"),
        Text(f"{share.weight_share:6.1%} (w {t.weight:g})", justify="right"),
        Text(str(t.waiting), justify="right"),
        Text(str(t.running), justify="right"),
        Text(str(t.refused), justify="right", style="red" if t.refused else ""),
        Text(f"{t.counter:,.0f}", justify="right"),
    ]


class TenantsScreen(PolledScreen[AdminState]):
    COMMAND_SCOPE = "tenants"

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status")
        yield Static("Tenants", id="tenants-title", classes="screen-title")
        table: DataTable[Text] = DataTable(id="tenants-table", cursor_type="row")
        table.border_title = "Service so far, most served first"
        table.border_subtitle = "share of weighted service against share of weight"
        yield table
        yield Static("", id="tenants-message", classes="screen-message")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.show_status(self.console.status)

    async def fetch(self, client: ConsoleClient) -> AdminState:
        return await client.state()

    def show_data(self, data: AdminState) -> None:
        rows = shares(data.tenants)
        shown, rest = rows[:TENANT_ROWS], len(rows) - TENANT_ROWS
        self.query_one("#tenants-title", Static).update(
            f"Tenants · queue {data.queue_order.name} · {len(rows)} seen"
        )
        sync_rows(self.query_one(DataTable), [(s.tenant.name, _cells(s)) for s in shown])
        self.say(f"{rest} more, less served" if rest > 0 else "")
