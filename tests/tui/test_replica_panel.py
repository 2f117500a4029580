"""The replicas panel on recorded fleet states: up, one down, gone, back with a new pid (and
the restarted mark for a while), converged; absent without a fleet."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import REPLACEMENT, FakeClock, RecordedServer, fleet_states
from tui.app import ConsoleApp
from tui.models import ReplicaView
from tui.replicas import GONE_KEEP_S, RESTART_MARK_S, ReplicaRoster
from tui.widgets.replica_panel import ReplicaPanel

SIZE = (120, 40)


def rows(app: ConsoleApp) -> dict[str, list[str]]:
    """The panel's rows as shown: key → cell texts."""
    table = app.screen.query_one("#replica-table", DataTable)
    return {key.value: [str(cell) for cell in table.get_row(key)] for key in table.rows}


def notes(app: ConsoleApp) -> list[str]:
    return str(app.screen.query_one("#replica-notes", Static).render()).splitlines()


def totals(app: ConsoleApp) -> str:
    return str(app.screen.query_one("#replica-totals", Static).render())


async def test_a_replica_goes_down_and_comes_back_with_a_new_pid() -> None:
    states = fleet_states()
    order = ["up", "down", "gone", "back", "converged"]
    server = RecordedServer([states[name] for name in order])
    clock = FakeClock()
    app = ConsoleApp(quiet_settings(), client=server.client(), clock=clock)
    first, second = (r["replica"] for r in states["up"]["replicas"])
    async with app.run_test(size=SIZE) as pilot:
        panel = app.screen.query_one(ReplicaPanel)
        await poll_times(pilot, app, 1)
        assert panel.display
        shown = rows(app)
        assert list(shown) == [first, second]
        assert shown[first][:4] == [first, "up", "41873", "v3"]
        assert shown[first][4:9] == ["2", "4", "6", "201", "1843"]
        assert shown[second][9] == "freed 2 ev 0 188→190"
        assert "2/2 up" in totals(app) and "gen tok 3453" in totals(app)

        await poll_times(pilot, app, 2)  # the second stops answering
        down = rows(app)[second]
        assert down[1] == "DOWN" and down[2] == "41874"
        (note,) = notes(app)  # the error's first line only
        died = "ActorDiedError: The actor died unexpectedly before finishing this task."
        assert note == f"{second} DOWN: {died}"
        assert "1/2 up" in totals(app) and "1/2 up" in str(panel.border_title)

        clock.now += 2
        await poll_times(pilot, app, 3)  # Ray dropped it: still shown down, with its error
        assert list(rows(app)) == [first, second] and rows(app)[second][1] == "DOWN"
        assert notes(app) == [note]

        clock.now += 3
        await poll_times(pilot, app, 4)  # the replacement takes its row
        back = rows(app)
        assert list(back) == [first, REPLACEMENT]
        assert back[REPLACEMENT][:4] == [REPLACEMENT, "restarted", "42117", "v2 behind"]
        assert back[first][1] == "up"
        assert notes(app) == [f"{REPLACEMENT} restarted: replaced {second}, pid 41874 → 42117"]
        assert "versions v2,v3" in totals(app)

        await poll_times(pilot, app, 5)
        assert rows(app)[REPLACEMENT][1:4] == ["restarted", "42117", "v3"]
        clock.now += RESTART_MARK_S
        await poll_times(pilot, app, 6)
        assert rows(app)[REPLACEMENT][1] == "up" and notes(app) == []


async def test_without_a_fleet_the_panel_is_absent_and_its_key_says_so() -> None:
    app = ConsoleApp(quiet_settings(), client=RecordedServer().client())
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 2)
        panel = app.screen.query_one(ReplicaPanel)
        assert not panel.display and panel.region.height == 0
        await pilot.press("f")
        await wait_for(pilot, lambda: app._notifications, what="notice")
        assert "no --replicas" in str(list(app._notifications)[-1].message)


async def test_its_key_focuses_the_rows() -> None:
    app = ConsoleApp(quiet_settings(), client=RecordedServer([fleet_states()["up"]]).client())
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("f")
        assert app.focused is app.screen.query_one("#replica-table", DataTable)


def view(replica: str, pid: int | None, up: bool = True, started: float = 1.0) -> ReplicaView:
    return ReplicaView(replica=replica, up=up, pid=pid, started_at=started if up else None)


def test_the_same_id_with_another_pid_or_start_is_a_restart() -> None:
    roster = ReplicaRoster()
    roster.update([view("a", 10), view("b", 20)], now=0.0)
    (a, b) = roster.update([view("a", 11), view("b", 20, started=2.0)], now=1.0)
    assert a.restarted(1.0) and a.replaced_pid == 10 and a.replaced is None
    assert b.restarted(1.0) and b.replaced_pid == 20
    (a, b) = roster.update([view("a", 11), view("b", 20, started=2.0)], now=2.0)
    assert a.restarted(2.0) and not a.restarted(1.0 + RESTART_MARK_S)


def test_a_row_that_left_is_kept_down_for_a_while_then_dropped() -> None:
    roster = ReplicaRoster()
    roster.update([view("a", 10), view("b", 20)], now=0.0)
    rows = roster.update([view("a", 10)], now=1.0)
    assert [(r.key, r.up, r.view.error) for r in rows] == [
        ("a", True, None),
        ("b", False, "no longer in the fleet"),
    ]
    assert [r.key for r in roster.update([view("a", 10)], now=1.0 + GONE_KEEP_S)] == ["a"]


def test_only_a_replica_that_left_gives_up_its_row() -> None:
    """Both listed but not answering (the state call timed out on each): a new replica gets
    a row of its own; the one that then leaves the list is replaced by the next new one, and a
    late answer from it is ignored."""
    roster = ReplicaRoster()
    roster.update([view("a", 10), view("b", 20)], now=0.0)
    roster.update([view("a", None, up=False), view("b", None, up=False)], now=1.0)
    rows = roster.update([view("a", None, up=False), view("b", None, up=False), view("c", 30)], 2.0)
    assert [(r.key, r.up, r.replaced) for r in rows] == [
        ("a", False, None),
        ("b", False, None),
        ("c", True, None),
    ]
    rows = roster.update([view("a", 10), view("c", 30)], now=3.0)
    assert [(r.key, r.up) for r in rows] == [("a", True), ("b", False), ("c", True)]
    assert not rows[0].restarted(3.0)  # same pid: it was only slow
    rows = roster.update([view("a", 10), view("c", 30), view("d", 40)], now=4.0)
    assert [(r.key, r.replaced) for r in rows] == [("a", None), ("d", "b"), ("c", None)]
    assert rows[1].restarted(4.0) and rows[1].replaced_pid == 20
    rows = roster.update([view("a", 10), view("b", 21), view("c", 30), view("d", 40)], now=5.0)
    assert [r.key for r in rows] == ["a", "d", "c"]


async def test_a_replica_being_drained_says_so() -> None:
    """A replica flagged ``draining``, or the one a running rolling restart drains."""
    flagged, restarting = fleet_states()["up"], fleet_states()["up"]
    flagged["replicas"][0]["draining"] = True
    second = restarting["replicas"][1]["replica"]
    restarting["restart"] = {
        "id": 1,
        "state": "running",
        "replicas": [r["replica"] for r in restarting["replicas"]],
        "left": [second],
        "started": [],
        "draining": second,
    }
    app = ConsoleApp(quiet_settings(), client=RecordedServer([flagged, restarting]).client())
    async with app.run_test(size=SIZE) as pilot:
        await poll_times(pilot, app, 1)
        assert [cells[1] for cells in rows(app).values()] == ["draining", "up"]
        await poll_times(pilot, app, 2)
        assert [cells[1] for cells in rows(app).values()] == ["up", "draining"]
        title = str(app.screen.query_one(ReplicaPanel).border_title)
        assert "rolling restart 0/2" in title
