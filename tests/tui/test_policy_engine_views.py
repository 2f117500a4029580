"""The schedules view and the guardrail panel against recorded responses: what they show,
that the console's poll refreshes them, and the kill switch (confirmation, PUT, read-only)."""

from __future__ import annotations

import asyncio
import copy
import json

import httpx
import pytest

from control.fleet.schemas import AdminState as ServerAdminState
from control.guardrail.schemas import DecisionList as ServerDecisionList
from control.guardrail.schemas import GuardrailUpdate
from control.guardrail.schemas import GuardrailView as ServerGuardrailView
from control.schedules.schemas import ScheduleList as ServerScheduleList
from tests.tui.conftest import active_actions, poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load
from tui.app import ConsoleApp, MainScreen
from tui.models import GuardrailStatus
from tui.screens.confirm import ConfirmScreen
from tui.screens.guardrail import KILL_REASON, GuardrailScreen
from tui.screens.schedules import SchedulesScreen
from tui.widgets.guardrail_panels import status_panel

SIZE = (120, 40)


def console(server: RecordedServer, read_only: bool = False) -> ConsoleApp:
    return ConsoleApp(
        quiet_settings(read_only=read_only), client=server.client(read_only=read_only)
    )


def text(app: ConsoleApp, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


def calls(server: RecordedServer, path: str, method: str = "GET") -> int:
    return sum(1 for r in server.requests if r.url.path == path and r.method == method)


async def open_screen(pilot, app: ConsoleApp, key: str, cls: type) -> None:  # type: ignore[no-untyped-def]
    await poll_times(pilot, app, 1)
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, cls), what=cls.__name__)
    await wait_for(pilot, lambda: app.screen.data is not None, what="its data")
    await pilot.pause()


def test_recorded_fixtures_are_what_the_server_answers() -> None:
    """The fixtures parse with the server's own response models (and would fail with them)."""
    ServerScheduleList.model_validate(load("schedules"))
    view = ServerGuardrailView.model_validate(load("guardrail"))
    ServerDecisionList.model_validate(load("guardrail_decisions"))
    ServerAdminState.model_validate(load("state"))
    ServerAdminState.model_validate(load("state_fleet"))
    GuardrailUpdate.model_validate({**view.config.model_dump(), "reason": KILL_REASON})


# -- schedules -------------------------------------------------------------------------


async def test_schedules_view_shows_each_window_its_next_firing_and_the_one_in_force() -> None:
    app = console(RecordedServer())
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "w", SchedulesScreen)
        table = app.screen.query_one("#schedules-table")
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert rows[0][:3] == ["1", "0 1 * * * → 05:00", "Europe/Berlin"]
        assert rows[0][3] == "dynamic max_batch_size=64"
        # 2026-11-30T00:00Z is 01:00 in Berlin (CET, UTC+1)
        assert rows[0][5:] == ["Mon 30 Nov 01:00 CET", "30 Nov 00:00"]
        assert rows[1][0] == "● 2" and rows[1][4] == "5"
        assert rows[2][5:] == ["Sat 05 Dec 02:30 EST", "05 Dec 07:30"]
        window = text(app, "#schedules-window")
        assert "Window in force: schedule 2" in window
        assert "since Sun 29 Nov 10:00 UTC, until 12:30 UTC" in window
        assert "schedule 1" in text(app, "#schedules-detail")
        assert "(high wins)" in text(app, "#schedules-detail")  # not the requests' direction
        await pilot.press("down")
        detail = text(app, "#schedules-detail")
        assert "morning report traffic" in detail and "reserve=0.15" in detail


async def test_schedules_view_is_refreshed_by_the_consoles_poll_only_while_open() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 2)
        assert calls(server, "/admin/schedules") == 0  # the main screen does not fetch it
        await open_screen(pilot, app, "w", SchedulesScreen)
        ended = copy.deepcopy(load("schedules"))
        ended["active"] = None
        ended["items"][1]["active"] = False
        server.routes["GET", "/admin/schedules"] = lambda r: httpx.Response(200, json=ended)
        before, polls = calls(server, "/admin/schedules"), app.polls_ok
        app.poll()
        await wait_for(pilot, lambda: app.polls_ok == polls + 1, what="a poll")
        await pilot.pause()
        assert calls(server, "/admin/schedules") == before + 1
        assert "No window in force" in text(app, "#schedules-window")
        assert str(app.screen.query_one("#schedules-table").get_row_at(1)[0]) == "2"
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)
        fetched = calls(server, "/admin/schedules")
        await poll_times(pilot, app, app.polls_ok + 1)
        assert calls(server, "/admin/schedules") == fetched


async def test_a_screen_opened_during_a_poll_is_filled_by_the_next_one_at_once() -> None:
    """The poll in flight started before the screen was on top; the one it asked for follows
    right away (the timer here would wait an hour), and the two never overlap."""
    server = RecordedServer()
    in_flight = peak = 0

    async def slow_state(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.2)
        in_flight -= 1
        return httpx.Response(200, json=load("state"))

    server.routes["GET", "/admin/state"] = slow_state  # type: ignore[assignment]
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        app.poll()
        await wait_for(pilot, lambda: in_flight == 1, what="a poll in flight")
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, SchedulesScreen))
        await wait_for(pilot, lambda: app.screen.data is not None, what="its data")
        # The third poll asks for both at once: which request the transport sees first is
        # the event loop's choice, so the count is awaited, not read at the screen's fill.
        await wait_for(pilot, lambda: app.polls_ok == 3, what="that poll's end")
        paths = [r.url.path for r in server.requests]
        assert (paths.count("/admin/state"), paths.count("/admin/schedules")) == (3, 1)
        assert peak == 1


async def test_a_missing_route_is_said_on_the_screen_and_the_console_stays_live() -> None:
    server = RecordedServer()
    del server.routes["GET", "/admin/guardrail"]
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("g")
        await wait_for(pilot, lambda: isinstance(app.screen, GuardrailScreen))
        await wait_for(pilot, lambda: app.screen.error is not None, what="the error")
        await pilot.pause()
        assert "Could not load: Not Found" in text(app, "#guardrail-message")
        assert app.connection == "live"
        server.routes["GET", "/admin/guardrail"] = lambda r: httpx.Response(
            200, json=load("guardrail")
        )
        app.poll()
        await wait_for(pilot, lambda: app.screen.data is not None, what="recovered")
        await pilot.pause()
        assert text(app, "#guardrail-message") == ""


# -- guardrail -------------------------------------------------------------------------


async def test_guardrail_panel_shows_objectives_bounds_status_and_decisions() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        decisions = [r for r in server.requests if r.url.path == "/admin/guardrail/decisions"]
        assert decisions and all(r.url.params["limit"] == "10" for r in decisions)
        title = text(app, "#guardrail-title")
        assert "mode SHADOW (records only)" in title and "revision 4 by alice" in title
        config = text(app, "#guardrail-config")
        assert "TTFT p99 ≤ 1.00 s" in config and "TPOT p99 ≤ 50 ms" in config
        assert "goodput" not in config  # not an objective here
        bounds = text(app, "#guardrail-bounds")
        assert "max_num_seqs 16 – 256" in bounds and "max_wait_s not moved" in bounds
        assert "policies continuous, hybrid" in bounds
        status = text(app, "#guardrail-status")
        for part in ("● evaluating", "calibrated small (cpu)", "×1.18", "margin -31%"):
            assert part in status
        assert "schedule 2's window is in force: it wins" in status
        table = app.screen.query_one("#guardrail-decisions")
        row = [str(c) for c in table.get_row_at(1)]
        assert row[:4] == ["11", "09:58:02", "applied", "v7"]
        assert row[4:7] == ["410 ms → 460 ms ×1.12", "47 ms → 46 ms ×0.97", "812 → 771 ×0.95"]
        # not applied: compared with the setting that stayed, the error not measured yet
        assert str(table.get_row_at(0)[4]) == "1.31 s → …"
        assert str(table.get_row_at(2)[4]) == "3.20 s → 2.90 s ×0.91"
        await pilot.press("down")
        detail = text(app, "#guardrail-detail")
        assert "applied as version 7" in detail
        assert "max_num_batched_tokens 256 -> 1024" in detail  # the reason, whole
        assert "TTFT p99 ×1.12" in detail and "tok/s ×0.95" in detail


@pytest.mark.parametrize(("margin", "style"), [(-0.31, "$text-error"), (0.4, "$text-success")])
def test_the_margin_is_red_when_an_objective_is_missed(margin: float, style: str) -> None:
    content = status_panel(GuardrailStatus(active=True, margin=margin))
    shown = f"{margin * 100:+.0f}%"
    start = content.plain.index(shown)
    styles = {str(s.style) for s in content.spans if s.start <= start < s.end}
    assert any(style in s for s in styles), styles
    assert ("objective missed" in content.plain) == (margin < 0)


async def test_guardrail_that_cannot_evaluate_says_why() -> None:
    server = RecordedServer()
    view = load("guardrail")
    view["config"]["mode"] = "on"
    reason = "off: the server has no cost model (start it with --cost-model)"
    view["status"] = {"active": False, "reason": reason, "cost_model": None}
    server.routes["GET", "/admin/guardrail"] = lambda r: httpx.Response(200, json=view)
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        status = text(app, "#guardrail-status")
        assert f"○ {reason}" in " ".join(status.split())
        assert "margin —" in status


async def test_kill_switch_asks_first_then_puts_the_config_back_with_mode_off() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        screen = app.screen
        assert "kill_switch" in active_actions(app, screen)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert "Mode shadow → off" in text(app, ".dialog-body")
        await pilot.click("#confirm-no")
        await wait_for(pilot, lambda: "Left as it is" in text(app, "#guardrail-message"))
        assert server.changes() == []
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        reads = calls(server, "/admin/guardrail")
        await pilot.click("#confirm-yes")
        await wait_for(pilot, lambda: bool(server.changes()), what="the PUT")
        (put,) = server.changes()
        assert (put.method, put.url.path) == ("PUT", "/admin/guardrail")
        assert calls(server, "/admin/guardrail") > reads  # read again right before the PUT
        sent = json.loads(put.content)
        assert sent == {**load("guardrail")["config"], "mode": "off", "reason": KILL_REASON}
        GuardrailUpdate.model_validate(sent)  # the server's own body model takes it
        await wait_for(pilot, lambda: "Guardrail off" in text(app, "#guardrail-message"))
        assert "revision 5" in text(app, "#guardrail-message")


async def test_kill_switch_on_a_guardrail_already_off_sends_nothing() -> None:
    server = RecordedServer()
    view = load("guardrail")
    view["config"]["mode"] = "off"
    server.routes["GET", "/admin/guardrail"] = lambda r: httpx.Response(200, json=view)
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        assert "OFF (kill switch: changes nothing)" in text(app, "#guardrail-title")
        await pilot.press("k")
        await wait_for(pilot, lambda: "off already" in text(app, "#guardrail-message"))
        assert not isinstance(app.screen, ConfirmScreen)
        assert server.changes() == []


async def test_read_only_refuses_the_kill_switch() -> None:
    server = RecordedServer()
    app = console(server, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        assert "kill_switch" not in active_actions(app)
        footer = " ".join(b.binding.description for b in app.screen.active_bindings.values())
        assert "Kill switch" not in footer
        await pilot.press("k")
        await pilot.pause(0.2)
        assert isinstance(app.screen, GuardrailScreen)
        assert app.screen.query_one("#guardrail-status").border_subtitle in (None, "")
        assert not any(r.method != "GET" for r in server.requests)


async def test_client_reads_the_policy_engine_routes() -> None:
    server = RecordedServer()
    client = server.client()
    schedules = await client.schedules()
    view = await client.guardrail()
    decisions = await client.guardrail_decisions(3)
    assert schedules.active == 2 and [s.id for s in schedules.items] == [1, 2, 3]
    assert view.config.bounds.knobs()["max_num_batched_tokens"].max == 4096  # type: ignore[union-attr]
    assert view.status.observed is not None and view.status.observed.requests == 42
    assert [d.outcome for d in decisions.items] == ["window_active", "applied", "conflict"]
    assert server.requests[-1].url.params["limit"] == "3"
    await client.aclose()
