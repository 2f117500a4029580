"""The request detail view (``d`` or enter on the requests table) against recorded responses:
its text, and what it says when the server keeps no text or has dropped it. Its timeline:
tests/tui/test_timeline_view.py."""

from __future__ import annotations

import copy

from textual.widgets import Static

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load
from tui.app import ConsoleApp, MainScreen
from tui.screens.request_detail import RequestDetailScreen
from tui.widgets.request_table import RequestTable

SHOWN = load("request_text")


def console(server: RecordedServer, read_only: bool = False) -> ConsoleApp:
    return ConsoleApp(quiet_settings(read_only=read_only), client=server.client(read_only))


def text_of(app: ConsoleApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


def text_asks(server: RecordedServer) -> list[str]:
    return [
        r.url.path
        for r in server.requests
        if r.url.path.startswith("/admin/requests/") and not r.url.path.endswith("/timeline")
    ]


async def open_detail(pilot, app: ConsoleApp, seq_id: str | None = None, key: str = "d") -> None:
    """After the first poll: the cursor on ``seq_id`` (when given), ``key``, the detail on top."""
    await poll_times(pilot, app, 1)
    if seq_id is not None:
        table = app.screen.query_one(RequestTable)
        table.move_cursor(row=table.get_row_index(seq_id))
        await pilot.pause()
        assert table.selected_id() == seq_id
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, RequestDetailScreen), what="detail")


async def test_d_shows_the_selected_requests_prompt_and_output() -> None:
    server = RecordedServer()
    app = console(server, read_only=True)  # reading text changes nothing: read-only has it
    async with app.run_test(size=(120, 40)) as pilot:
        await open_detail(pilot, app, SHOWN["id"])
        await wait_for(pilot, lambda: app.screen.text is not None, what="its text")
        assert text_asks(server) == [f"/admin/requests/{SHOWN['id']}"]
        assert text_of(app, "#request-prompt-text") == SHOWN["prompt"]
        assert text_of(app, "#request-output-text") == SHOWN["output"]
        title = text_of(app, "#request-title")
        assert SHOWN["id"] in title and "running" in title
        assert "streaming" in str(app.screen.query_one("#request-output").border_subtitle)

        app.poll()  # each poll fetches it again: the output as it streams
        await wait_for(pilot, lambda: len(text_asks(server)) == 2, what="the next poll's fetch")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), what="main again")


async def test_enter_on_a_row_opens_it_too() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_detail(pilot, app, SHOWN["id"], key="enter")
        assert app.screen.seq_id == SHOWN["id"]


async def test_without_expose_text_it_says_why_and_asks_nothing() -> None:
    state = copy.deepcopy(load("state"))
    state["text_exposed"] = False
    server = RecordedServer([state])
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_detail(pilot, app)
        await wait_for(pilot, lambda: app.screen.data is not None, what="the reason")
        message = text_of(app, "#request-message")
        assert "--expose-text" in message and "private" in message
        assert text_asks(server) == []
        assert text_of(app, "#request-prompt-text") == ""


async def test_a_409_says_why_even_when_the_state_did_not() -> None:
    """An older server's state has no ``text_exposed``; its 409 is what tells."""
    state = copy.deepcopy(load("state"))
    del state["text_exposed"]
    server = RecordedServer([state])
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        app.snapshot.state.text_exposed = True  # as a console that did not know would assume
        await open_detail(pilot, app)  # the first poll is done: no other
        await wait_for(pilot, lambda: app.screen.data is not None, what="the reason")
        assert "--expose-text" in text_of(app, "#request-message")
        assert len(text_asks(server)) == 1


async def test_dropped_text_keeps_what_was_shown_and_says_so() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_detail(pilot, app, SHOWN["id"])
        await wait_for(pilot, lambda: app.screen.text is not None, what="its text")
        server.text_gone = True
        app.poll()
        await wait_for(pilot, lambda: "no longer" in text_of(app, "#request-message"), what="404")
        assert "no longer keeps" in text_of(app, "#request-message")
        assert text_of(app, "#request-prompt-text") == SHOWN["prompt"]


async def test_d_on_an_empty_table_says_so() -> None:
    state = copy.deepcopy(load("state"))
    state["requests"] = []
    server = RecordedServer([state])
    app = console(server)
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)
        assert text_asks(server) == []
