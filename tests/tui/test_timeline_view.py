"""A request's timeline in the detail view (``d``; issue 41) against recorded responses: the
bar, the transitions, the summary; without ``--expose-text``; a dropped timeline; a server
older than the timelines and a newer one."""

from __future__ import annotations

import copy

from textual.widgets import DataTable, Static

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer, load
from tui.app import ConsoleApp
from tui.models import RequestTimeline
from tui.screens.request_detail import NO_TIMELINES, RequestDetailScreen
from tui.waits import figures_change
from tui.widgets.request_table import RequestTable
from tui.widgets.timeline import TimelineBar, cell_widths, end_of, transition_rows

SIZE = (120, 40)
TIMELINE = load("timeline")
SEQ = TIMELINE["seq_id"]


def console(server: RecordedServer) -> ConsoleApp:
    return ConsoleApp(quiet_settings(), client=server.client())


async def open_timeline(pilot, app: ConsoleApp) -> RequestDetailScreen:  # type: ignore[no-untyped-def]
    await poll_times(pilot, app, 1)
    table = app.screen.query_one(RequestTable)
    table.move_cursor(row=table.get_row_index(SEQ))
    await pilot.press("d")
    await wait_for(pilot, lambda: isinstance(app.screen, RequestDetailScreen), what="detail")
    screen = app.screen
    assert isinstance(screen, RequestDetailScreen)
    await wait_for(pilot, lambda: screen.data is not None, what="its first fetch")
    await pilot.pause()
    return screen


def transitions(screen: RequestDetailScreen) -> list[tuple[str, ...]]:
    table = screen.query_one("#timeline-transitions", DataTable)
    return [tuple(cell.plain for cell in table.get_row_at(i)) for i in range(table.row_count)]


def note(screen: RequestDetailScreen) -> str:
    widget = screen.query_one("#timeline-note", Static)
    return str(widget.render()) if widget.display else ""


async def test_the_timeline_draws_its_phases_and_lists_its_transitions() -> None:
    app = console(RecordedServer())
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_timeline(pilot, app)
        rows = transitions(screen)
        assert len(rows) == len(TIMELINE["segments"]) + len(TIMELINE["events"])
        assert [row[2] for row in rows[:4]] == [
            "● arrived",
            "█ wait · next step",
            "▒ wait · behind",
            "█ wait · kv blocks",
        ]
        assert rows[2][3] == "3 ahead · head held by kv blocks 67% · group runs 33%"
        assert rows[3][:2] == ("+0.650", "450 ms")
        assert rows[3][3] == "needs 32 blocks, 10→30 free (reserve 51)"
        preempted = next(row for row in rows if row[2] == "● preempted")
        assert preempted[0] == "+3.500" and preempted[3].startswith("memory")
        assert rows[-1][2] == "█ decode" and rows[-1][1] == "1.45 s…"  # open: to now (age 6.2)
        assert "512 tokens in 2 steps (256+256)" in {row[3] for row in rows}

        bar, marks, legend = str(screen.query_one(TimelineBar).render()).splitlines()
        width = screen.query_one(TimelineBar).content_region.width
        assert len(bar) == width and bar[0] == "█" and "▒" in bar and "▓" in bar
        assert marks.index("▲") < marks.index("✕")  # first token before the preemption
        assert "kv blocks 1.55 s" in legend and "behind (kv blocks) 630 ms" in legend
        subtitle = str(screen.query_one("#request-timeline").border_subtitle)
        assert subtitle == "6.20 s · TTFT 1.31 s · waited 2.20 s · preempted 1×"


async def test_without_expose_text_the_timeline_still_shows() -> None:
    state = copy.deepcopy(load("state"))
    state["text_exposed"] = False
    server = RecordedServer([state])
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_timeline(pilot, app)
        assert screen.timeline is not None and transitions(screen)
        assert "--expose-text" in str(screen.query_one("#request-message", Static).render())
        title = str(screen.query_one("#request-title", Static).render())
        assert title == f"Request {SEQ} · running"
        assert not screen.query_one("#request-prompt").display  # the timeline takes the room
        asked = [r.url.path for r in server.requests if r.url.path.startswith("/admin/requests")]
        assert asked == [f"/admin/requests/{SEQ}/timeline"]


async def test_a_dropped_timeline_keeps_what_was_shown_and_says_so() -> None:
    server = RecordedServer()
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_timeline(pilot, app)
        shown = transitions(screen)
        server.timeline_gone = True
        app.poll()
        await wait_for(pilot, lambda: "no longer" in note(screen), what="the 404")
        assert "the last one shown stays" in note(screen)
        assert transitions(screen) == shown


async def test_an_older_server_without_timelines_shows_the_text_alone() -> None:
    server = RecordedServer()
    server.timelines = False
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_timeline(pilot, app)
        assert note(screen) == NO_TIMELINES
        assert not screen.query_one(TimelineBar).display
        assert not screen.query_one("#timeline-transitions").display
        assert screen.text is not None and app.connection == "live"


async def test_a_newer_servers_phases_reasons_and_fields_show_as_named() -> None:
    server = RecordedServer()
    body = server.timeline_body
    body["replica"] = "r1"
    body["segments"][0] |= {"reason": "tenant_slot", "tokens": 5}
    body["segments"][3]["phase"] = "swap_in"
    body["events"].append({"kind": "migrated", "time": 811.0, "to": "r2"})
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_timeline(pilot, app)
        what = [row[2] for row in transitions(screen)]
        assert "█ wait · tenant slot" in what and "█ swap_in" in what and "● migrated" in what
        assert note(screen) == ""


def test_every_segment_gets_a_cell_and_the_bar_fills_its_width() -> None:
    assert cell_widths([10.0, 0.001, 0.0, 5.0], 30) == [19, 1, 1, 9]
    assert sum(cell_widths([1.0] * 7, 10)) == 10
    assert cell_widths([1.0] * 12, 10) == [0] * 12  # more segments than cells: sampled


def test_a_waits_figures_from_first_to_last_step() -> None:
    first = {"needed": None, "free": 0, "reserve": 51}
    assert figures_change(first, first) == "pool dry: 0 free (reserve 51)"
    assert figures_change(first, {"needed": 36, "free": 30, "reserve": 51}) == (
        "needs —→36 blocks, 0→30 free (reserve 51)"
    )
    assert figures_change({"running": 4, "cap": 4}, {"running": 4, "cap": 2}) == "4/4→2 running"
    assert figures_change(None, {"left": 0, "budget": 512, "needed": None}) == (
        "0 of 512 prompt tokens left"
    )


def test_the_wire_model_reads_the_servers_example() -> None:
    timeline = RequestTimeline.model_validate(TIMELINE)
    assert timeline.segments[1].held_by[0].reason == "group_running"
    assert timeline.segments[-1].end is None and not timeline.finished


def test_an_open_segment_runs_to_now_or_to_the_last_time_named() -> None:
    timeline = RequestTimeline.model_validate(TIMELINE)
    assert end_of(timeline, 812.5) == 812.5  # arrival 806.3 + the state's age 6.2
    assert end_of(timeline, None) == 811.05  # not listed: the open decode's start
    last = transition_rows(timeline, None)[-1][1]
    assert [cell.plain for cell in last[:3]] == ["+4.750", "0 ms…", "█ decode"]
