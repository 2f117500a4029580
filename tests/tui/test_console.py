"""Console behaviour against recorded responses: polling, table, editor, maintenance."""

from __future__ import annotations

import asyncio
import copy
import json

import httpx
from textual.widgets import Input, Select, Static

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load, reply
from tui.app import ConsoleApp
from tui.config import ConsoleSettings
from tui.screens.confirm import ConfirmScreen
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.policy_editor import PolicyEditorScreen
from tui.widgets.block_map import BlockMap
from tui.widgets.queue_panel import QueuePanel
from tui.widgets.request_table import RequestTable
from tui.widgets.status_header import StatusHeader


def console(server: RecordedServer, **settings: object) -> ConsoleApp:
    return ConsoleApp(quiet_settings(**settings), client=server.client())


def text_of(app: ConsoleApp, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


# -- polling ---------------------------------------------------------------------------


async def test_polls_never_overlap_and_each_arms_the_next() -> None:
    server = RecordedServer()
    in_flight = peak = 0

    async def slow_state(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.15)  # slower than the refresh interval
        in_flight -= 1
        return httpx.Response(200, json=load("state"))

    server.routes["GET", "/admin/state"] = slow_state  # type: ignore[assignment]
    app = console(server, refresh=0.05, min_refresh=0.05)
    async with app.run_test() as pilot:
        for _ in range(10):
            app.poll()  # asking while one runs does nothing
            await pilot.pause(0.03)
        await wait_for(pilot, lambda: app.polls_ok >= 4, what="4 polls")
    assert peak == 1


async def test_pause_stops_polling_and_resume_starts_at_once() -> None:
    server = RecordedServer()

    async def slow_state(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.1)
        return httpx.Response(200, json=load("state"))

    server.routes["GET", "/admin/state"] = slow_state  # type: ignore[assignment]
    app = console(server, refresh=0.05, min_refresh=0.05)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.polls_ok >= 2, what="polling")
        await wait_for(pilot, lambda: app._polling, what="a poll in flight")
        await pilot.press("p")  # the poll in flight lands but arms nothing
        await pilot.pause(0.2)
        paused_at = app.polls_ok
        await pilot.pause(0.4)
        assert app.polls_ok == paused_at
        assert "paused" in text_of(app, "#status")
        await pilot.press("p")
        await wait_for(pilot, lambda: app.polls_ok > paused_at, what="resume")


async def test_plus_and_minus_step_the_refresh_interval() -> None:
    app = ConsoleApp(ConsoleSettings(url="http://x", refresh=1.0), client=RecordedServer().client())
    async with app.run_test() as pilot:
        await pilot.press("plus")
        assert app.refresh_s == 0.5
        await pilot.press("plus", "plus", "plus")
        assert app.refresh_s == 0.25  # the floor
        await pilot.press("minus", "minus", "minus")
        assert app.refresh_s == 2.0
        assert "every 2s" in text_of(app, "#status")


async def test_redraw_waits_while_a_modal_is_open() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test() as pilot:
        await poll_times(pilot, app, 1)
        main = app.screen
        busier = copy.deepcopy(load("state"))
        busier["queue"] = {"waiting": 40, "running": 9}
        server.states = [busier]
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        app.poll()
        await wait_for(pilot, lambda: app.polls_ok == 2)
        assert main.query_one(QueuePanel).state.queue.waiting == 7  # not redrawn
        await pilot.press("escape")
        await pilot.pause()
        assert main.query_one(QueuePanel).state.queue.waiting == 40
        assert "waiting 40" in str(main.query_one(QueuePanel).render())


async def test_the_queue_panel_counts_the_running_requests_a_grammar_constrains() -> None:
    state = load("state")
    assert "constrained" not in str(state["requests"])  # as an older server answers
    server = RecordedServer()
    app = console(server)
    async with app.run_test() as pilot:
        await poll_times(pilot, app, 1)
        panel = app.screen.query_one(QueuePanel)
        assert "constrained" not in str(panel.render())  # none: the line stays as it was
        constrained = copy.deepcopy(state)
        for request in constrained["requests"]:
            request["constrained"] = True
        running = sum(r["state"] == "running" for r in constrained["requests"])
        assert 0 < running < len(constrained["requests"])  # a waiting one is not counted
        server.states = [constrained]
        app.poll()
        await wait_for(pilot, lambda: app.polls_ok == 2)
        await pilot.pause()
        assert f"constrained {running}" in str(panel.render())


async def test_stale_warning_keeps_the_picture_and_clears_on_reconnect() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test() as pilot:
        await poll_times(pilot, app, 1)
        server.down = True
        app.poll()
        await wait_for(pilot, lambda: app.polls_failed == 1)
        header = text_of(app, "#status")
        assert "STALE" in header and "Showing the last picture" in header
        assert app.screen.has_class("-stale")
        assert app.screen.query_one(RequestTable).row_count == 12  # last picture kept
        server.down = False
        app.poll()
        await wait_for(pilot, lambda: app.polls_ok == 2)
        assert "STALE" not in text_of(app, "#status")
        assert not app.screen.has_class("-stale")


async def test_refused_token_is_said_plainly() -> None:
    server = RecordedServer()
    server.routes["GET", "/admin/state"] = lambda r: httpx.Response(
        403, json={"detail": "wrong admin token"}
    )
    app = console(server)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.polls_failed == 1)
        assert "refused" in text_of(app, "#status")
        assert "wrong admin token" in text_of(app, "#status")


# -- panels ----------------------------------------------------------------------------


async def test_request_table_updates_in_place_and_keeps_the_cursor() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        table = app.screen.query_one(RequestTable)
        table.move_cursor(row=table.get_row_index("cmpl-001"))
        later = copy.deepcopy(load("state"))
        later["requests"] = [r for r in later["requests"] if r["id"] != "cmpl-004"]
        for r in later["requests"]:
            r["age_s"] += 5.0
        later["requests"][0]["generated_tokens"] = 99  # cmpl-001
        server.states = [later]
        added, removed = [], []
        table.add_row = _spy(table.add_row, added)  # type: ignore[method-assign]
        table.remove_row = _spy(table.remove_row, removed)  # type: ignore[method-assign]
        await poll_times(pilot, app, 2)
        assert added == [] and len(removed) == 1  # in place, not rebuilt
        assert table.row_count == 11
        row = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        assert row == "cmpl-001"
        assert table.get_cell("cmpl-001", "generated_tokens").text == "99"


def _spy(method, calls: list):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return method(*args, **kwargs)

    return wrapper


async def test_request_table_sorts_by_any_column_and_filters() -> None:
    app = console(RecordedServer())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        table = app.screen.query_one(RequestTable)

        def column(key: str) -> list:
            index = [*table.columns].index(key)
            return [table.get_row_at(i)[index].value for i in range(table.row_count)]

        for _ in range(7):
            await pilot.press("s")
            assert column(table.sort_column) == sorted(column(table.sort_column), reverse=True)
        await pilot.press("S")
        assert column(table.sort_column) == sorted(column(table.sort_column))
        await pilot.click(RequestTable, offset=(44, 1))  # the "Wait s" header
        assert table.sort_column == "wait_s"
        assert column("wait_s") == sorted(column("wait_s"))
        await pilot.click(RequestTable, offset=(44, 1))
        assert column("wait_s") == sorted(column("wait_s"), reverse=True)
        await pilot.press("slash", *"wait")
        assert table.row_count == 7
        assert set(column("state")) == {"waiting"}
        await pilot.press("escape")
        assert table.row_count == 12


async def test_block_map_has_one_cell_per_block_and_the_reserve_threshold() -> None:
    app = console(RecordedServer())
    async with app.run_test(size=(120, 50)) as pilot:  # room for 512 cells above the waits
        await poll_times(pilot, app, 1)
        block_map = app.screen.query_one(BlockMap)
        text = str(block_map.render())
        state = load("state")
        assert text.count("■") == state["kv"]["used"] + state["kv"]["cached"] + 2  # + legend
        assert text.count("·") >= state["kv"]["free"]
        assert text.count("┃") == 2  # the gauge's threshold and the legend
        assert "limit 461/512" in text and "util 93.8%" in text
        assert block_map.blocks_per_cell(40, 30) == 1
        assert block_map.blocks_per_cell(10, 10) == 9  # 512 blocks in 60 cells


# -- editor ----------------------------------------------------------------------------


async def open_editor(pilot, app: ConsoleApp) -> PolicyEditorScreen:  # type: ignore[no-untyped-def]
    await poll_times(pilot, app, 1)
    await pilot.press("e")
    await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen))
    return app.screen  # type: ignore[return-value]


def field(editor: PolicyEditorScreen, name: str) -> Input:
    return editor.query_one(f"#field-policy-params-{name} Input", Input)


async def test_editor_builds_the_form_from_the_schema_with_bounds() -> None:
    app = console(RecordedServer())
    async with app.run_test(size=(120, 40)) as pilot:
        editor = await open_editor(pilot, app)
        assert field(editor, "max_batch_size").value == "16"
        assert field(editor, "length_window").value == "128"
        bounds = [str(label.render()) for label in editor.query(".field-bounds")]
        assert bounds == ["[1 – 65536]", "[1 – 1048576]", "[0 – 0.5]", "[0.5 – 3600]"]
        editor.query_one("#policy-name", Select).value = "continuous"
        await pilot.pause()
        bounds = [str(label.render()) for label in editor.query(".field-bounds")]
        assert bounds[:2] == [
            "[1 – 65536, empty = engine cap (256)]",
            "[1 – 1048576, empty = engine cap (2048)]",
        ]
        assert editor.query_one("#field-policy-params-enable_chunked_prefill")


async def test_editor_apply_sends_the_diffed_change_with_if_match() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        editor = await open_editor(pilot, app)
        field(editor, "max_batch_size").value = "24"
        editor.query_one("#reason", Input).value = "more batching"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        assert "policy.params.max_batch_size" in str(app.screen.query_one(".dialog-body").render())
        assert server.changes() == []  # only the dry run so far
        await pilot.click("#confirm-yes")
        await wait_for(pilot, lambda: "Applied" in str(editor._message), what="applied")
        (put,) = server.changes()
        assert put.headers["if-match"] == '"3"'
        assert json.loads(put.content) == {
            "reason": "more batching",
            "policy": {"name": "dynamic", "params": {"max_batch_size": 24}},
        }
        assert "version 4" in str(editor._message)


async def test_editor_blocks_bad_values_and_missing_reason_client_side() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        editor = await open_editor(pilot, app)
        field(editor, "max_batch_size").value = "0"
        await pilot.press("ctrl+s")
        await pilot.pause()
        errors = [str(e.render()) for e in editor.query(".field-error")]
        assert "Must be between 1 and 65536." in errors
        assert "A reason is required." in errors
        assert [r for r in server.requests if r.method != "GET"] == []


async def test_editor_shows_the_servers_validation_message() -> None:
    server = RecordedServer()
    server.routes["PUT", "/admin/policy"] = reply("update_422", status=422)
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        editor = await open_editor(pilot, app)
        field(editor, "max_batch_size").value = "300"
        editor.query_one("#reason", Input).value = "bigger"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "refused" in str(editor._message))
        assert "engine cap max_num_seqs=256" in str(editor._message)
        error = editor.query_one("#field-policy-params-max_batch_size .field-error", Static)
        assert "engine cap" in str(error.render())
        assert not isinstance(app.screen, ConfirmScreen)
        assert server.changes() == []


async def test_editor_says_clearly_what_a_conflict_means() -> None:
    server = RecordedServer()
    server.routes["PUT", "/admin/policy"] = reply("update_409", status=409)
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        editor = await open_editor(pilot, app)
        field(editor, "max_batch_size").value = "24"
        editor.query_one("#reason", Input).value = "r"
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: "Conflict" in str(editor._message))
        message = str(editor._message)
        assert "version is 5, not 3" in message and "Reload" in message


async def test_history_rolls_back_after_confirmation() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        history = app.screen
        await wait_for(pilot, lambda: history.active == 3)
        await pilot.press("down", "r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#confirm-yes")
        await wait_for(pilot, lambda: bool(server.changes()))
        (post,) = server.changes()
        assert post.url.path == "/admin/policy/rollback/2"
        assert post.headers["if-match"] == '"3"'
        assert json.loads(post.content) == {"reason": "rollback to v2"}


# -- maintenance -----------------------------------------------------------------------


async def test_sweep_now_asks_first() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        assert "10:13:35" in text_of(app, "#maintenance")
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#confirm-no")
        await pilot.pause()
        assert server.changes() == []
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#confirm-yes")
        await wait_for(pilot, lambda: bool(server.changes()))
        assert server.changes()[0].url.path == "/admin/reclaim"


async def test_header_shows_url_policy_version_and_uptime() -> None:
    app = console(RecordedServer())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        header = str(app.screen.query_one(StatusHeader).render())
        for part in ("http://servedeck.test:8000", "live", "dynamic v3", "up 13m 32s"):
            assert part in header
