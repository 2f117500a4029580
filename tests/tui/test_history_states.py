"""The history screen shows each version's state (pending, applied, failed) and why."""

from __future__ import annotations

import copy

import httpx

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load
from tui.app import ConsoleApp
from tui.screens.history import HistoryScreen


def history_with_states() -> dict:
    history = copy.deepcopy(load("history"))
    newest, middle, oldest = history["items"]
    newest["status"] = {
        "state": "pending",
        "state_reason": "the engine has not taken it yet; retried until it is in force",
        "state_at": "2026-11-29T10:02:00Z",
    }
    middle["status"] = {
        "state": "failed",
        "state_reason": "superseded by version 3 before it was in force",
        "state_at": "2026-11-29T10:02:00Z",
    }
    oldest["status"] = {"state": "applied", "state_reason": None, "state_at": None}
    return history


async def test_history_shows_pending_and_failed_versions_with_the_reason() -> None:
    server = RecordedServer()
    body = history_with_states()
    server.routes["GET", "/admin/policy/history"] = lambda r: httpx.Response(200, json=body)
    app = ConsoleApp(quiet_settings(), client=server.client())
    async with app.run_test(size=(140, 40)) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        history = app.screen
        await wait_for(pilot, lambda: history.active == 3)
        table = history.query_one("#history-table")
        labels = [str(table.get_row_at(row)[0]) for row in range(table.row_count)]
        assert labels == ["v3 ● pending", "v2 failed", "v1"]
        detail = str(history.query_one("#history-detail").render())
        assert "pending: the engine has not taken it yet" in detail
        await pilot.press("down")
        await wait_for(
            pilot,
            lambda: "failed: superseded" in str(history.query_one("#history-detail").render()),
        )
