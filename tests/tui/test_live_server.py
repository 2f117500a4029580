"""The console against a real ``servedeck serve`` process (one for the module; the last test
stops and restarts it on the same port and database)."""

from __future__ import annotations

import asyncio

from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Select

from tests.tui.conftest import ADMIN_TOKEN, LiveServer, active_actions, send_load, wait_for
from tui.app import ConsoleApp
from tui.client import HttpClient
from tui.commands import COMMANDS, RegistryCommands, mutating_actions
from tui.config import ConsoleSettings
from tui.screens.confirm import ConfirmScreen
from tui.screens.history import HistoryScreen
from tui.screens.policy_editor import PolicyEditorScreen
from tui.screens.request_detail import RequestDetailScreen
from tui.waits import wait_label
from tui.widgets.queue_panel import QueuePanel
from tui.widgets.request_table import RequestTable
from tui.widgets.status_header import StatusHeader
from tui.widgets.timeline import TimelineBar
from tui.widgets.waits_panel import WaitsPanel

SIZE = (120, 40)


def console(live: LiveServer, refresh: float = 0.25, read_only: bool = False) -> ConsoleApp:
    return ConsoleApp(
        ConsoleSettings(url=live.url, token=ADMIN_TOKEN, refresh=refresh, read_only=read_only)
    )


def header(app: ConsoleApp) -> str:
    return str(app.screen.query_one(StatusHeader).render())


async def type_into(pilot: Pilot, widget: Input, text: str) -> None:
    widget.value = ""
    widget.focus()
    await pilot.press(*text)


async def open_editor(pilot: Pilot, app: ConsoleApp) -> PolicyEditorScreen:
    await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
    await pilot.press("e")
    await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen), what="editor")
    return app.screen  # type: ignore[return-value]


async def test_shows_the_servers_policy_and_queue(live_server: LiveServer) -> None:
    policy = live_server.policy()
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
        name, version = policy["settings"]["policy"]["name"], policy["version"]
        assert f"{name} v{version}" in header(app) and "live" in header(app)
        load = send_load(live_server.url, requests=12, concurrency=6, max_tokens=200)
        table = app.screen.query_one(RequestTable)
        await wait_for(pilot, lambda: table.row_count > 0, timeout=30, what="requests shown")
        state = app.snapshot.state
        queue = str(app.screen.query_one(QueuePanel).render())
        assert f"waiting {state.queue.waiting}  running {state.queue.running}" in queue
        assert {key.value for key in table.rows} == {r.id for r in state.requests}
        assert state.requests and state.queue.waiting + state.queue.running > 0
        # why each waits, as the server says (a running one: no wait), and the waits panel
        for request in state.requests:
            cell = table.get_cell(request.id, "wait").text
            assert (cell == "") == (request.wait is None)
            if request.wait is not None:
                assert cell == wait_label(request.wait)
        waits = app.screen.query_one(WaitsPanel)
        assert state.waits is not None and waits.display
        assert waits.border_title == f"Waiting ({state.waits.window_s:g} s)"
        load.join(timeout=120)


async def test_detail_follows_a_live_request_to_its_end(live_server: LiveServer) -> None:
    """``d`` on a running request shows the prompt the server read and the output it streamed,
    polled until it finishes; what the screen ends with is what the server kept."""
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
        load = send_load(live_server.url, requests=12, concurrency=6, max_tokens=200)
        table = app.screen.query_one(RequestTable)
        await wait_for(pilot, lambda: table.row_count > 0, timeout=30, what="requests shown")
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, RequestDetailScreen), what="detail")
        screen = app.screen
        assert isinstance(screen, RequestDetailScreen)
        await wait_for(pilot, lambda: screen.text is not None, timeout=10, what="its text")
        assert screen.text is not None and "quick brown fox" in screen.text.prompt
        await wait_for(
            pilot,
            lambda: (
                screen.text is not None
                and screen.text.state == "finished"
                and screen.timeline is not None
                and screen.timeline.finished
            ),
            timeout=60,
            what="the request's end, polled",
        )
        kept = live_server.admin("GET", f"/requests/{screen.seq_id}").json()
        shown = str(screen.query_one("#request-output-text").render())
        assert kept["finish_reason"] == "length" and kept["output_chars"] > 0
        assert shown == kept["output"]
        assert "finished (length)" in str(screen.query_one("#request-title").render())
        # its timeline as the server keeps it: every segment and event listed, from arrival
        timeline = live_server.admin("GET", f"/requests/{screen.seq_id}/timeline").json()
        transitions = screen.query_one("#timeline-transitions", DataTable)
        assert transitions.row_count == len(timeline["segments"]) + len(timeline["events"])
        phases = {seg["phase"] for seg in timeline["segments"]}
        assert {"prefill", "decode"} <= phases
        whats = [transitions.get_row_at(i)[2].plain for i in range(transitions.row_count)]
        assert whats[0] == "● arrived" and whats[-1] == "● finished"
        assert transitions.get_row_at(transitions.row_count - 1)[3].plain == "length"
        legend = str(screen.query_one(TimelineBar).render()).splitlines()[-1]
        assert "prefill" in legend and "decode" in legend
        load.join(timeout=120)


async def test_editor_change_moves_the_servers_active_version(live_server: LiveServer) -> None:
    before = live_server.policy()
    target = "static" if before["settings"]["policy"]["name"] == "dynamic" else "dynamic"
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        editor = await open_editor(pilot, app)
        editor.query_one("#policy-name", Select).value = target
        await pilot.pause()
        size = editor.query_one("#field-policy-params-max_batch_size Input", Input)
        await type_into(pilot, size, "8")
        await type_into(pilot, editor.query_one("#reason", Input), "pilot test")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await pilot.click("#confirm-yes")
        await wait_for(pilot, lambda: "Applied" in str(editor._message), what="applied")
        after = live_server.policy()
        assert after["version"] == before["version"] + 1
        assert after["settings"]["policy"] == {"name": target, "params": {"max_batch_size": 8}}
        assert after["reason"] == "pilot test"
        await pilot.press("escape")
        await wait_for(
            pilot,
            lambda: f"{target} v{after['version']}" in header(app),
            what="header shows the new version",
        )


async def test_bad_value_shows_the_servers_message_and_changes_nothing(
    live_server: LiveServer,
) -> None:
    before = live_server.policy()
    bad = {"policy": {"name": "dynamic", "params": {"max_batch_size": 300}}, "reason": "x"}
    answer = live_server.admin("PUT", "/policy", params={"dry_run": "true"}, json=bad)
    assert answer.status_code == 422
    server_message = answer.json()["detail"][0]["msg"]
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        editor = await open_editor(pilot, app)
        editor.query_one("#policy-name", Select).value = "dynamic"
        await pilot.pause()
        size = editor.query_one("#field-policy-params-max_batch_size Input", Input)
        await type_into(pilot, size, "300")  # within the schema's bounds, over the engine cap
        await type_into(pilot, editor.query_one("#reason", Input), "too big")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "refused" in str(editor._message), what="refusal")
        assert server_message in str(editor._message)
        field_error = editor.query_one("#field-policy-params-max_batch_size .field-error")
        assert server_message in str(field_error.render())
        assert not isinstance(app.screen, ConfirmScreen)
    assert live_server.policy() == before


async def test_read_only_has_no_way_to_change_anything(live_server: LiveServer) -> None:
    before = live_server.policy()
    manual_sweeps = _manual_sweeps(live_server)
    app = console(live_server, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
        assert isinstance(app.client, HttpClient) and app.client.read_only
        changers = mutating_actions()
        assert not active_actions(app) & changers
        hits = [hit async for hit in RegistryCommands(app.screen).discover()]
        assert hits and not any(
            c.description in str(h.display) for h in hits for c in COMMANDS if c.mutates
        )
        assert "sweep now" not in str(app.screen.query_one("#maintenance").border_subtitle)
        for command in COMMANDS:  # every key any screen knows, changers included
            for key in command.keys.split(","):
                if key not in ("q", "ctrl+q", "ctrl+p"):
                    await pilot.press(key)
                    await pilot.pause(0.05)
            assert not isinstance(app.screen, (PolicyEditorScreen, ConfirmScreen))
            while len(app.screen_stack) > 1:
                app.pop_screen()
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), what="history")
        await wait_for(pilot, lambda: app.screen.active is not None, what="history loaded")
        assert not active_actions(app) & changers
        assert not app.screen.query("Button")
        await pilot.press("down", "r", "enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen)
    assert live_server.policy() == before
    assert _manual_sweeps(live_server) == manual_sweeps


def _manual_sweeps(live: LiveServer) -> int:
    jobs = live.admin("GET", "/jobs").json()["jobs"]
    return sum(1 for job in jobs for run in job["last_runs"] if run["trigger"] == "manual")


async def test_stale_warning_on_server_stop_clears_on_restart(live_server: LiveServer) -> None:
    version = live_server.policy()["version"]
    app = console(live_server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
        await asyncio.to_thread(live_server.stop)
        await wait_for(pilot, lambda: "STALE" in header(app), timeout=15, what="stale")
        assert "No answer" in header(app) and "reconnecting" in header(app)
        assert app.screen.has_class("-stale")
        assert f"v{version}" in header(app)  # the last picture stays
        assert app.screen.query_one(QueuePanel).state is not None
        failed = app.polls_failed
        restart = asyncio.create_task(asyncio.to_thread(live_server.start))
        await wait_for(pilot, lambda: "STALE" not in header(app), timeout=90, what="reconnect")
        await restart
        assert app.polls_failed > failed  # it kept trying while the server came back
        assert "live" in header(app) and f"v{version}" in header(app)
        assert not app.screen.has_class("-stale")
