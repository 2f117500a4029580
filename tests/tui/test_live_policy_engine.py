"""The schedules view and the guardrail kill switch against a real ``servedeck serve``."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from textual.pilot import Pilot

from tests.tui.conftest import ADMIN_TOKEN, LiveServer, active_actions, wait_for
from tui.app import ConsoleApp
from tui.config import ConsoleSettings
from tui.screens.confirm import ConfirmScreen
from tui.screens.guardrail import KILL_REASON, GuardrailScreen
from tui.screens.schedules import SchedulesScreen

SIZE = (120, 40)


def console(live: LiveServer, read_only: bool = False) -> ConsoleApp:
    return ConsoleApp(
        ConsoleSettings(
            url=live.url, token=ADMIN_TOKEN, refresh=0.5, read_only=read_only, actor="ops-console"
        )
    )


async def open_screen(pilot: Pilot, app: ConsoleApp, key: str, cls: type) -> None:
    await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, cls), what=cls.__name__)
    await wait_for(pilot, lambda: app.screen.data is not None, what="its data")
    await pilot.pause()


def guardrail(live: LiveServer) -> dict:
    response = live.admin("GET", "/guardrail")
    response.raise_for_status()
    return response.json()


async def test_schedules_view_shows_the_servers_schedule_and_next_firing(
    live_server: LiveServer,
) -> None:
    body = {
        "cron": "0 1 * * *",
        "until": "05:00",
        "timezone": "Europe/Berlin",
        "policy": {"name": "dynamic", "params": {"max_batch_size": 16}},
        "reason": "nightly offline batch",
    }
    created = live_server.admin("POST", "/schedules", json=body)
    assert created.status_code == 201, created.text
    stored = created.json()
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "w", SchedulesScreen)
        table = app.screen.query_one("#schedules-table")
        row = [str(c) for c in table.get_row(str(stored["id"]))]
        at = datetime.fromisoformat(stored["next_run_at"])
        berlin = at.astimezone(ZoneInfo("Europe/Berlin"))
        assert berlin.strftime("%H:%M") == "01:00"
        assert row[1:4] == ["0 1 * * * → 05:00", "Europe/Berlin", "dynamic max_batch_size=16"]
        assert row[5] == berlin.strftime("%a %d %b %H:%M %Z")
        assert row[6] == at.strftime("%d %b %H:%M")
    live_server.admin("DELETE", f"/schedules/{stored['id']}", params={"reason": "test done"})


async def test_kill_switch_turns_the_servers_guardrail_off(live_server: LiveServer) -> None:
    config = {
        "mode": "shadow",
        "objectives": {"ttft_p99_s": 1.5},
        "bounds": {"policies": ["continuous"], "max_num_seqs": {"min": 4, "max": 64}},
        "reason": "watch first",
    }
    put = live_server.admin("PUT", "/guardrail", json=config)
    assert put.status_code == 200, put.text
    before = put.json()
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        panel = app.screen
        assert "mode SHADOW" in str(panel.query_one("#guardrail-title").render())
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert guardrail(live_server)["revision"] == before["revision"]  # nothing yet
        await pilot.click("#confirm-yes")
        await wait_for(
            pilot,
            lambda: "Guardrail off" in str(panel.query_one("#guardrail-message").render()),
            what="turned off",
        )
    after = guardrail(live_server)
    assert after["config"] == {**before["config"], "mode": "off"}  # the rest sent back as it was
    assert after["revision"] == before["revision"] + 1
    assert (after["actor"], after["reason"]) == ("ops-console", KILL_REASON)


async def test_read_only_console_cannot_turn_the_guardrail_off(live_server: LiveServer) -> None:
    on = {"mode": "shadow", "objectives": {"ttft_p99_s": 1.5}, "reason": "watch again"}
    before = live_server.admin("PUT", "/guardrail", json=on).json()
    app = console(live_server, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await open_screen(pilot, app, "g", GuardrailScreen)
        status = app.screen.query_one("#guardrail-status")
        await wait_for(  # the server says why it does not evaluate; the poll brings it
            pilot,
            lambda: "○ off: the server has no cost model" in str(status.render()),
            what="the reason it is off",
        )
        assert "kill_switch" not in active_actions(app)
        await pilot.press("k")
        await pilot.pause(0.3)
        assert isinstance(app.screen, GuardrailScreen)
    after = guardrail(live_server)
    assert after["revision"] == before["revision"] and after["config"]["mode"] == "shadow"
