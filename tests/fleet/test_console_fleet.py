"""The console against a real ``servedeck serve --replicas 2``: the replicas panel shows both,
then a killed replica DOWN, then its replacement back with a new pid and the restarted mark."""

from __future__ import annotations

import os
import signal

import httpx
from textual.widgets import DataTable, Static

from tests.control.support import TOKEN, ServerProcess, wait_for
from tests.fleet.conftest import REPLICAS
from tests.fleet.support import state
from tests.tui.conftest import wait_for as wait_in
from tui.app import ConsoleApp
from tui.config import ConsoleSettings
from tui.widgets.replica_panel import ReplicaPanel


def shown(app: ConsoleApp) -> dict[str, list[str]]:
    table = app.screen.query_one("#replica-table", DataTable)
    return {key.value: [str(cell) for cell in table.get_row(key)] for key in table.rows}


def notes(app: ConsoleApp) -> str:
    return str(app.screen.query_one("#replica-notes", Static).render())


async def test_the_console_shows_a_killed_replica_down_and_back(
    fleet_server: ServerProcess, fleet: httpx.Client
) -> None:
    settings = ConsoleSettings(url=fleet_server.url, token=TOKEN, refresh=0.25)
    app = ConsoleApp(settings)
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.screen.query_one(ReplicaPanel)

        def all_up() -> bool:
            rows = shown(app) if panel.display else {}
            return len(rows) == REPLICAS and all(r[1] == "up" for r in rows.values())

        await wait_in(pilot, all_up, timeout=30, what="both replicas up")
        assert not app.screen.query_one("#replica-notes", Static).display
        victim = app.snapshot.state.replicas[-1]
        assert shown(app)[victim.replica][2] == str(victim.pid)

        os.kill(victim.pid, signal.SIGKILL)  # no traffic meanwhile: the polls alone
        await wait_in(
            pilot,
            lambda: shown(app).get(victim.replica, [""] * 2)[1] == "DOWN",
            timeout=30,
            what="the killed replica shown DOWN",
        )
        assert f"{victim.replica} DOWN: " in notes(app)
        assert "2/2 up" not in str(panel.border_title)

        def back() -> list[str] | None:
            rows = shown(app)
            new = [r for key, r in rows.items() if key != victim.replica and r[1] == "restarted"]
            return new[0] if len(rows) == REPLICAS and new else None

        try:
            await wait_in(pilot, back, timeout=60, what="a replacement, marked restarted")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {shown(app)} {notes(app)} {app.detail}") from None
        replacement = back()
        assert replacement is not None and replacement[2] != str(victim.pid)
        assert f"pid {victim.pid} → {replacement[2]}" in notes(app)
        assert victim.replica not in shown(app)

    # The server agrees; and the fleet is whole again, at the version in force, for the
    # tests that follow on the same server.
    def converged() -> bool:
        body = state(fleet)
        up = [r for r in body["replicas"] if r["up"] and r["version"] == body["version"]]
        return len(up) == REPLICAS

    wait_for(converged, timeout=30)
    pids = {r["replica"]: r["pid"] for r in state(fleet)["replicas"]}
    assert victim.replica not in pids and str(pids[replacement[0]]) == replacement[2]
