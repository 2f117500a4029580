"""Why requests wait, on the main screen (issue 41): each waiting request's reason and seconds
in the requests table, and the waits panel (the window's seconds by reason, biggest first, the
head, the tail). Against recorded responses, and against an older and a newer server."""

from __future__ import annotations

import copy
from typing import Any

from textual.widgets import Input

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load
from tui.app import ConsoleApp
from tui.waits import CLASS_STYLES
from tui.widgets.request_table import RequestTable
from tui.widgets.waits_panel import WaitsPanel

SIZE = (120, 40)
RED = CLASS_STYLES["memory"]


def console(state: dict[str, Any]) -> ConsoleApp:
    return ConsoleApp(quiet_settings(), client=RecordedServer([state]).client())


def wait_cells(app: ConsoleApp) -> dict[str, tuple[str, str, str]]:
    """Each shown request's Wait cell (text, colour) and Wait s cell, by id."""
    table = app.screen.query_one(RequestTable)
    out = {}
    for key in table.rows:
        wait, seconds = table.get_cell(key, "wait"), table.get_cell(key, "wait_s")
        out[str(key.value)] = (wait.text, wait.style, seconds.text)
    return out


def panel_lines(app: ConsoleApp) -> list[str]:
    return str(app.screen.query_one(WaitsPanel).render()).splitlines()


def older(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a server older than issue 41 sends it: no ``wait``, no ``waits``."""
    state = copy.deepcopy(state)
    del state["waits"]
    for request in state["requests"]:
        request.pop("wait", None)
    return state


async def test_waiting_requests_show_their_reason_coloured_and_their_seconds() -> None:
    app = console(load("state"))
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        cells = wait_cells(app)
        assert cells["cmpl-006"] == ("kv blocks", RED, "0.9")  # the head: its own reason
        assert cells["cmpl-007"] == ("↳kv blocks", RED, "0.8")  # behind a head held for KV
        assert cells["cmpl-012"] == ("next step", CLASS_STYLES["step"], "0.1")
        assert cells["cmpl-001"] == ("", "", "")  # running: no wait
        table = app.screen.query_one(RequestTable)
        assert "behind the queue's head" in str(table.border_subtitle)

        table.sort_column, table.sort_reverse = "wait_s", True
        await pilot.pause()
        order = [str(row.key.value) for row in table.ordered_rows]
        assert order[:7] == [f"cmpl-{i:03d}" for i in range(6, 13)]  # the running ones after


async def test_the_filter_finds_requests_by_what_holds_them() -> None:
    app = console(load("state"))
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("slash", *"kv", "enter")
        table = app.screen.query_one(RequestTable)
        await wait_for(pilot, lambda: table.row_count == 6, what="the six held for KV blocks")
        assert app.screen.query_one("#request-filter", Input).value == "kv"


async def test_the_panel_shows_the_windows_waiting_biggest_first_the_head_and_the_tail() -> None:
    app = console(load("state"))
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        panel = app.screen.query_one(WaitsPanel)
        assert panel.display and panel.border_title == "Waiting (60 s)"
        assert "38.60 s" in str(panel.border_subtitle)  # 23.7 + 9.6 + 3.1 + 1.8 + 0.4
        lines = panel_lines(app)
        labels = [line[:11].strip() for line in lines[:4]]
        assert labels == ["kv blocks", "group runs", "budget", "next step"]
        assert "61%" in lines[0] and "23.70 s" in lines[0]
        assert lines[4].startswith("+1 more") and "400 ms" in lines[4]
        assert lines[5] == "head cmpl-006: kv blocks"
        assert lines[6].strip() == "needs 12 blocks, 3 free (reserve 51)"
        assert "TTFT ≥ p99 2.40 s" in lines[7]
        assert lines[8].strip() == "kv blocks 80% · group runs 20%"


async def test_a_window_without_waiting_says_so() -> None:
    state = copy.deepcopy(load("state"))
    state["waits"] |= {"recent": [], "head": None, "tail_ttft_s": None, "tail": []}
    app = console(state)
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        assert panel_lines(app) == [
            "no waiting in the last 60 s",
            "tail: nothing finished in the window",
        ]


async def test_an_older_server_without_reasons_hides_them() -> None:
    app = console(older(load("state")))
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        assert app.connection == "live"
        assert not app.screen.query_one(WaitsPanel).display
        assert {cells for cells in wait_cells(app).values()} == {("", "", "")}
        assert app.screen.query_one(RequestTable).row_count == 12


async def test_a_newer_servers_reasons_and_fields_show_as_named() -> None:
    """A reason, figures and fields this console does not know: shown as the server names
    them, never a failed poll."""
    state = copy.deepcopy(load("state"))
    novel = {"reason": "tenant_slot", "figures": {"slots": 2, "used": 2}, "since_step": 7}
    state["requests"][5]["wait"] = {
        "reason": "tenant_slot",
        "hold": novel,
        "seconds": 0.9,
        "ahead": None,
        "step": 41,
    }
    state["waits"]["recent"].append({"reason": "tenant_slot", "seconds": 90.0, "steps": 3})
    state["waits"]["head"] = {"seq_id": "cmpl-006", "hold": novel, "replica": "r1"}
    state["waits"]["percentiles"] = {"p50": 0.1}
    app = console(state)
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        assert app.connection == "live"
        assert wait_cells(app)["cmpl-006"] == ("tenant slot", CLASS_STYLES["other"], "0.9")
        lines = panel_lines(app)
        assert lines[0].startswith("tenant slot") and "70%" in lines[0]
        assert "head cmpl-006: tenant slot" in lines and "  slots=2 used=2" in lines
