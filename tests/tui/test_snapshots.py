"""Snapshot tests on fixed data: recorded responses, explicit polls, a fake clock.

Update after an intended change with ``pytest tests/tui --snapshot-update`` and review the
SVGs under __snapshots__/.
"""

from __future__ import annotations

import copy

from textual.pilot import Pilot
from textual.widgets import Input

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import FakeClock, RecordedServer, fleet_states, load, reply, state_series
from tui.app import ConsoleApp
from tui.screens.history import HistoryScreen
from tui.screens.policy_editor import PolicyEditorScreen

SIZE = (120, 40)


def console(server: RecordedServer, **settings: object) -> ConsoleApp:
    return ConsoleApp(quiet_settings(**settings), client=server.client())


def test_main_screen(snap_compare) -> None:
    app = console(RecordedServer(state_series(6)))

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 6)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_main_screen_stale_keeps_last_picture(snap_compare) -> None:
    server = RecordedServer(state_series(3))
    clock = FakeClock()
    app = ConsoleApp(quiet_settings(), client=server.client(), clock=clock)

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 3)
        server.down = True
        clock.now += 12
        app.poll()
        await wait_for(pilot, lambda: app.polls_failed == 1, what="failed poll")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_main_screen_filtered_and_sorted(snap_compare) -> None:
    app = console(RecordedServer())

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("s", "s", "s", "s", "S")  # prompt tokens, ascending
        await pilot.press("slash", *"run", "enter")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_editor(snap_compare) -> None:
    app = console(RecordedServer())

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen))
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_editor_dry_run_diff_and_client_error(snap_compare) -> None:
    app = console(RecordedServer())

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen))
        editor = app.screen
        editor.query_one("#field-policy-params-max_batch_size Input", Input).value = "24"
        editor.query_one("#reason", Input).value = "more batching"
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: editor._diff is not None, what="dry run")
        editor.query_one("#field-policy-params-length_window Input", Input).value = "0"
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_editor_server_validation_message(snap_compare) -> None:
    server = RecordedServer()
    server.routes["PUT", "/admin/policy"] = reply("update_422", status=422)
    app = console(server)

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen))
        editor = app.screen
        editor.query_one("#field-policy-params-max_batch_size Input", Input).value = "300"
        editor.query_one("#reason", Input).value = "bigger groups"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "refused" in str(editor._message), what="422 message")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_history(snap_compare) -> None:
    app = console(RecordedServer())

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await wait_for(pilot, lambda: app.screen.active is not None, what="history loaded")
        await pilot.press("down")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_help_read_only(snap_compare) -> None:
    app = console(RecordedServer(), read_only=True)

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_main_screen_fleet_one_replica_down(snap_compare) -> None:
    states = fleet_states()
    app = console(RecordedServer([states["up"], states["down"]]))

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_request_detail(snap_compare) -> None:
    app = console(RecordedServer())

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("down")  # cmpl-002, the recorded text's request
        await pilot.press("d")
        await wait_for(pilot, lambda: getattr(app.screen, "data", None) is not None, what="text")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_request_timeline_without_text(snap_compare) -> None:
    """A server without --expose-text: the timeline alone, the text panels saying why."""
    state = copy.deepcopy(load("state"))
    state["text_exposed"] = False
    app = console(RecordedServer([state]))

    async def run_before(pilot: Pilot) -> None:
        await poll_times(pilot, app, 1)
        await pilot.press("down")  # cmpl-002, the recorded timeline's request
        await pilot.press("d")
        await wait_for(pilot, lambda: getattr(app.screen, "data", None) is not None, what="it")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
