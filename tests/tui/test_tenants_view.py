"""The tenants view (``n``): each tenant's share of weighted service against its weight's
share, its queue, refusals and counter, the most served first, bounded, under the queue
discipline in force; and the request list's tenant and priority columns."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load
from tui.app import ConsoleApp
from tui.models import TenantInfo
from tui.screens.tenants import TENANT_ROWS, TenantsScreen, shares
from tui.widgets.request_table import RequestTable


def tenant(name: str, service: float, weight: float = 1.0, **rest: int) -> dict:
    return {"name": name, "service": service, "weight": weight, "counter": service / weight, **rest}


def test_shares_are_of_service_and_of_weight_most_served_first() -> None:
    rows = shares([TenantInfo(**tenant("b", 100.0)), TenantInfo(**tenant("a", 300.0, 2.0))])
    assert [r.tenant.name for r in rows] == ["a", "b"]
    assert rows[0].service_share == pytest.approx(0.75)
    assert rows[0].weight_share == pytest.approx(2 / 3)
    assert shares([TenantInfo(name="idle")])[0].service_share == 0.0


async def test_the_tenants_view_shows_shares_queue_and_the_discipline() -> None:
    state = load("state")
    state["queue_order"] = {"name": "fair", "weights": {"alice": 2}}
    state["tenants"] = [
        tenant("bob", 1000.0, waiting=4, running=2, refused=3),
        tenant("alice", 3000.0, 2.0, waiting=1, running=5),
        *(tenant(f"t{i}", float(i)) for i in range(TENANT_ROWS)),
    ]
    state["requests"][0] |= {"tenant": "alice", "priority": -5}
    app = ConsoleApp(quiet_settings(), client=RecordedServer([state]).client())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        requests = app.screen.query_one(RequestTable)
        rid = state["requests"][0]["id"]
        assert requests.get_cell(rid, "tenant").text == "alice"
        assert requests.get_cell(rid, "priority").text == "-5"
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, TenantsScreen))
        table = app.screen.query_one(DataTable)
        await wait_for(pilot, lambda: table.row_count == TENANT_ROWS)
        assert [table.get_row_at(i)[0].plain for i in range(2)] == ["alice", "bob"]
        total = 4000.0 + sum(range(TENANT_ROWS))
        assert table.get_cell("alice", "share").plain.strip() == f"{3000 / total:.1%}"
        assert "(w 2)" in table.get_cell("alice", "weight").plain
        assert table.get_cell("bob", "refused").plain == "3"
        assert table.get_cell("bob", "waiting").plain == "4"
        title = str(app.screen.query_one("#tenants-title", Static).render())
        assert "queue fair" in title and f"{TENANT_ROWS + 2} seen" in title
        message = str(app.screen.query_one("#tenants-message", Static).render())
        assert "2 more" in message
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, TenantsScreen))


async def test_the_request_filter_matches_the_tenant() -> None:
    app = ConsoleApp(quiet_settings(), client=RecordedServer().client())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        table = app.screen.query_one(RequestTable)
        await pilot.press("slash", *"batch")
        await wait_for(pilot, lambda: table.row_count == 6, what="batch's six requests")
        assert {table.get_cell(key, "tenant").text for key in table.rows} == {"batch"}
        assert str(table.border_subtitle).endswith("Prio: lower is served first")
