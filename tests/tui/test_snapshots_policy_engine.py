"""Snapshots of the schedules view, the guardrail panel and the tenants view on recorded
responses (see test_snapshots.py for how to update them)."""

from __future__ import annotations

from textual.pilot import Pilot

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer
from tui.app import ConsoleApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.guardrail import GuardrailScreen
from tui.screens.polled import PolledScreen
from tui.screens.schedules import SchedulesScreen
from tui.screens.tenants import TenantsScreen

SIZE = (120, 40)


def console(read_only: bool = False) -> ConsoleApp:
    server = RecordedServer()
    return ConsoleApp(quiet_settings(read_only=read_only), client=server.client(read_only))


async def open_screen(pilot: Pilot, app: ConsoleApp, key: str, cls: type[PolledScreen]) -> None:
    await poll_times(pilot, app, 1)
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, cls), what=cls.__name__)
    await wait_for(pilot, lambda: app.screen.data is not None, what="its data")
    await pilot.pause()


def test_schedules_view(snap_compare) -> None:
    app = console()

    async def run_before(pilot: Pilot) -> None:
        await open_screen(pilot, app, "w", SchedulesScreen)
        await pilot.press("down")  # the schedule in force, in the detail
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_guardrail_panel(snap_compare) -> None:
    app = console()

    async def run_before(pilot: Pilot) -> None:
        await open_screen(pilot, app, "g", GuardrailScreen)
        await pilot.press("down")  # the applied decision, measured after
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_guardrail_kill_switch_confirmation(snap_compare) -> None:
    app = console()

    async def run_before(pilot: Pilot) -> None:
        await open_screen(pilot, app, "g", GuardrailScreen)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_guardrail_panel_read_only(snap_compare) -> None:
    app = console(read_only=True)

    async def run_before(pilot: Pilot) -> None:
        await open_screen(pilot, app, "g", GuardrailScreen)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_tenants_view(snap_compare) -> None:
    app = console()

    async def run_before(pilot: Pilot) -> None:
        await open_screen(pilot, app, "n", TenantsScreen)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
