"""The servedeck console: the app, its polling loop and its main screen.

Polling follows dolphie: a worker fetches, the app redraws when it finishes and only then
arms the next poll with ``set_timer``. Polls never overlap, and pause is simply not
re-arming. While another screen or a modal is on top the redraw is skipped (the samples are
still recorded) and happens when the main screen comes back. A screen that shows polled data
of its own (schedules, guardrail: ``PolledScreen``) has it fetched in the same poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input

from tui.bindings import RegistryBindings
from tui.client import ApiError, ClientError, ConsoleClient, HttpClient
from tui.commands import COMMANDS, RegistryCommands
from tui.config import ConsoleSettings
from tui.models import AdminState, JobsView
from tui.screens.base import ConsoleScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.guardrail import GuardrailScreen
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.policy_editor import PolicyEditorScreen
from tui.screens.polled import PolledScreen
from tui.screens.request_detail import RequestDetailScreen
from tui.screens.schedules import SchedulesScreen
from tui.screens.tenants import TenantsScreen
from tui.widgets.block_map import BlockMap
from tui.widgets.latency_panel import LatencyPanel
from tui.widgets.maintenance_panel import MaintenancePanel
from tui.widgets.queue_panel import QueuePanel
from tui.widgets.replica_panel import ReplicaPanel
from tui.widgets.request_table import RequestTable
from tui.widgets.status_header import Connection, Status, StatusHeader
from tui.widgets.trends import TrendHistory, TrendsPanel
from tui.widgets.waits_panel import WaitsPanel

REFRESH_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one successful poll brought back."""

    state: AdminState
    jobs: JobsView


class MainScreen(ConsoleScreen):
    COMMAND_SCOPE = "main"
    AUTO_FOCUS = "#requests"
    """The requests, not the first focusable widget (the replicas' table, even hidden)."""

    def __init__(self, settings: ConsoleSettings, read_only: bool) -> None:
        super().__init__(read_only)
        self.settings = settings
        self._shown: Snapshot | None = None
        self._demo_rate: float | None = None
        """The demo load's rate when this console paused it (resumed at that rate)."""

    def compose(self) -> ComposeResult:
        s = self.settings
        thresholds = {
            "ttft": (s.ttft_warn_s, s.ttft_crit_s),
            "tpot": (s.tpot_warn_s, s.tpot_crit_s),
            "e2e": (s.e2e_warn_s, s.e2e_crit_s),
        }
        reclaim_key = next(
            (c.display_key for c in COMMANDS if c.id == "reclaim" and not self.read_only), None
        )
        yield StatusHeader(id="status")
        with Horizontal(id="top-row"):
            yield QueuePanel(id="queue", classes="panel")
            yield LatencyPanel(thresholds, id="latency", classes="panel")
            yield MaintenancePanel(reclaim_key, id="maintenance", classes="panel")
        yield ReplicaPanel(id="replicas", classes="panel")
        with Horizontal(id="middle-row"):
            with Vertical(id="requests-panel"):
                yield RequestTable(id="requests", classes="panel")
                yield Input(
                    placeholder="filter by id, state, tenant or wait · enter keeps · esc clears",
                    id="request-filter",
                    compact=True,
                )
            with Vertical(id="side"):
                yield BlockMap(id="kv", classes="panel")
                yield WaitsPanel(id="waits", classes="panel")
        yield TrendsPanel(id="trends", classes="panel")
        yield Footer()

    def show(self, status: Status, snapshot: Snapshot | None, history: TrendHistory) -> None:
        self.query_one(StatusHeader).status = status
        self.set_class(status.connection == "stale", "-stale")
        if snapshot is None or snapshot is self._shown:
            return
        self._shown = snapshot
        state, jobs = snapshot.state, snapshot.jobs
        self.query_one(QueuePanel).state = state
        self.query_one(LatencyPanel).latency = state.latency
        job = next((j for j in jobs.jobs if j.id == "kv_reclaim"), None) or (
            jobs.jobs[0] if jobs.jobs else None
        )
        runs = job.last_runs if job is not None and job.last_runs else state.recent_reclaims
        maintenance = self.query_one(MaintenancePanel)
        maintenance.job = job
        maintenance.runs = tuple(sorted(runs, key=lambda r: r.at or "", reverse=True))
        block_map = self.query_one(BlockMap)
        block_map.kv = state.kv
        block_map.block_map = state.block_map
        self.query_one(RequestTable).show(state.requests)
        self.query_one(WaitsPanel).summary = state.waits
        self.query_one(TrendsPanel).show(history)
        self.query_one(ReplicaPanel).show(state, self.console.clock())

    def on_screen_resume(self) -> None:
        self.console.redraw()

    # -- request table ------------------------------------------------------------------

    def action_filter(self) -> None:
        bar = self.query_one("#request-filter", Input)
        bar.display = True
        bar.focus()

    def action_clear_filter(self) -> None:
        bar = self.query_one("#request-filter", Input)
        bar.value = ""
        bar.display = False
        self.query_one(RequestTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "request-filter":
            self.query_one(RequestTable).filter_text = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "request-filter":
            if not event.value:
                event.input.display = False
            self.query_one(RequestTable).focus()

    def action_cycle_sort(self) -> None:
        self.query_one(RequestTable).cycle_sort()

    def action_reverse_sort(self) -> None:
        table = self.query_one(RequestTable)
        table.sort_reverse = not table.sort_reverse

    def action_replicas(self) -> None:
        if not self.query_one(ReplicaPanel).focus_table():
            self.notify("No replicas: the server runs one engine (no --replicas)")

    # -- policy and maintenance ---------------------------------------------------------

    def action_edit_policy(self) -> None:
        self.run_worker(self._open_editor(), group="open", exclusive=True)

    async def _open_editor(self) -> None:
        try:
            schema = await self.console.client.schema()
            view = await self.console.client.policy()
        except ClientError as exc:
            self.notify(f"Cannot open the editor: {exc}", severity="error")
            return
        await self.app.push_screen(PolicyEditorScreen(schema, view, self.read_only))

    def action_request_detail(self) -> None:
        seq_id = self.query_one(RequestTable).selected_id()
        if seq_id is None:
            self.notify("No request selected: the table is empty")
            return
        self.app.push_screen(RequestDetailScreen(self.read_only, seq_id))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, RequestTable):
            event.stop()
            self.action_request_detail()

    def action_history(self) -> None:
        self.app.push_screen(HistoryScreen(self.read_only))

    def action_schedules(self) -> None:
        self.app.push_screen(SchedulesScreen(self.read_only))

    def action_guardrail(self) -> None:
        self.app.push_screen(GuardrailScreen(self.read_only))

    def action_tenants(self) -> None:
        self.app.push_screen(TenantsScreen(self.read_only))

    def action_demo_load(self) -> None:
        self.run_worker(self._toggle_demo_load(), group="demo_load", exclusive=True)

    async def _toggle_demo_load(self) -> None:
        """Pause a running demo load, or resume a paused one at the rate it had."""
        client = self.console.client
        try:
            view = await client.demo_load()
            if not view.enabled:
                self.notify("No demo load: the server was started without --demo-load")
                return
            if view.rate > 0:
                self._demo_rate = view.rate
                view = await client.set_demo_load(0.0)
            else:
                view = await client.set_demo_load(self._demo_rate or view.start_rate)
        except ClientError as exc:
            self.notify(f"Demo load: {exc}", severity="error")
            return
        paused = view.rate == 0
        self.notify("Demo load paused" if paused else f"Demo load at {view.rate:g} requests/s")

    def action_reclaim(self) -> None:
        self.run_worker(self._reclaim(), group="reclaim", exclusive=True)

    async def _reclaim(self) -> None:
        answer = await self.app.push_screen_wait(
            ConfirmScreen(
                "Run the KV reclaim sweep now?",
                "Frees blocks no live request holds; evicts cached prefixes only if free "
                "blocks are under the reserve.",
                "Sweep now",
            )
        )
        if answer is None:
            return
        try:
            run = await self.console.client.reclaim()
        except ClientError as exc:
            self.notify(f"Sweep failed: {exc}", severity="error")
            return
        self.notify(
            f"Sweep {run.outcome}: freed {run.freed}, evicted {run.evicted}, "
            f"free {run.free_before}→{run.free_after}"
        )
        self.console.poll()


class ConsoleApp(RegistryBindings, App[None], inherit_bindings=False):
    """The app's keys are the registry's "app" scope alone: Textual's defaults (ctrl+q quit,
    ctrl+c hint) would reorder the footer and add keys no help line lists."""

    CSS_PATH = "console.tcss"
    TITLE = "servedeck console"
    COMMANDS = {RegistryCommands}  # noqa: RUF012 (Textual's declared type)
    COMMAND_SCOPE = "app"

    paused: reactive[bool] = reactive(False, init=False)
    refresh_s: reactive[float] = reactive(1.0, init=False)

    def __init__(
        self,
        settings: ConsoleSettings | None = None,
        *,
        client: ConsoleClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or ConsoleSettings()
        self.read_only = self.settings.read_only or bool(client is not None and client.read_only)
        super().__init__()
        self._owns_client = client is None
        self.client: ConsoleClient = client or HttpClient(
            self.settings.url,
            self.settings.token,
            read_only=self.read_only,
            actor=self.settings.actor,
            timeout_s=self.settings.timeout_s,
        )
        self.clock = clock
        self.set_reactive(ConsoleApp.refresh_s, self.settings.refresh)
        self.history = TrendHistory(self.settings.history_points)
        self.snapshot: Snapshot | None = None
        self.connection: Connection = "connecting"
        self.detail = ""
        self.last_ok: float | None = None
        self.polls_ok = 0
        self.polls_failed = 0
        self._polling = False
        self._again = False
        self._timer: Timer | None = None

    def get_default_screen(self) -> MainScreen:
        return MainScreen(self.settings, self.read_only)

    def on_mount(self) -> None:
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
        self.poll()

    async def on_unmount(self) -> None:
        self._disarm()
        if self._owns_client:
            await self.client.aclose()

    # -- polling ------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        state = self.snapshot.state if self.snapshot else None
        silent = None if self.last_ok is None else self.clock() - self.last_ok
        return Status(
            url=self.client.url,
            connection=self.connection,
            detail=self.detail,
            silent_s=silent,
            policy=state.policy.name if state else None,
            version=state.version if state else None,
            uptime_s=state.uptime_s if state else None,
            paused=self.paused,
            refresh_s=self.refresh_s,
            read_only=self.read_only,
        )

    def poll(self) -> None:
        """Fetch now; while a fetch is running, the next one starts as soon as it ends
        (instead of arming the timer), so a screen that just came on top gets its data."""
        if self._polling:
            self._again = True
            return
        self._disarm()
        self._polling = True
        self.run_worker(self._poll(), name="poll", group="poll", exit_on_error=False)

    async def _main_data(self) -> tuple[AdminState, JobsView]:
        state, jobs = await asyncio.gather(self.client.state(), self.client.jobs())
        return state, jobs

    async def _poll(self) -> None:
        screen = self.screen
        page = [screen.load()] if isinstance(screen, PolledScreen) else []
        try:
            # return_exceptions: a failed state call must not leave the page's fetch running
            # on after this poll ends (the page's own ClientErrors never reach here).
            main, loaded = await asyncio.gather(
                self._main_data(), asyncio.gather(*page), return_exceptions=True
            )
            if isinstance(loaded, BaseException):
                raise loaded
            if isinstance(main, BaseException):
                raise main
            state, jobs = main
        except ApiError as exc:
            self._failed(exc, refused=exc.status in (401, 403))
        except ClientError as exc:
            self._failed(exc, refused=False)
        else:
            self.snapshot = Snapshot(state, jobs)
            self.history.push(state)
            self.connection, self.detail = "live", ""
            self.last_ok = self.clock()
            self.polls_ok += 1
        finally:
            self._polling = False
        self.redraw()
        if self._again:
            self._again = False
            self.poll()
        else:
            self._arm()

    def _failed(self, exc: ClientError, refused: bool) -> None:
        self.polls_failed += 1
        self.detail = str(exc)
        if refused:
            self.connection = "refused"
        else:
            self.connection = "stale" if self.snapshot is not None else "connecting"

    def redraw(self) -> None:
        screen = self.screen
        if isinstance(screen, MainScreen):
            screen.show(self.status, self.snapshot, self.history)
        elif isinstance(screen, PolledScreen):
            screen.show_status(self.status)

    def _arm(self) -> None:
        if not self.paused and self.is_running:
            self._timer = self.set_timer(self.refresh_s, self.poll, name="poll")

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def watch_paused(self, paused: bool) -> None:
        if paused:
            self._disarm()
        else:
            self.poll()
        self.redraw()

    def watch_refresh_s(self) -> None:
        if self._timer is not None:
            self._disarm()
            self._arm()
        self.redraw()

    # -- app-wide actions ---------------------------------------------------------------

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused

    def action_refresh_faster(self) -> None:
        faster = [s for s in REFRESH_STEPS if s < self.refresh_s]
        self.refresh_s = max(faster[-1] if faster else self.refresh_s, self.settings.min_refresh)

    def action_refresh_slower(self) -> None:
        slower = [s for s in REFRESH_STEPS if s > self.refresh_s]
        self.refresh_s = min(slower[0] if slower else self.refresh_s, self.settings.max_refresh)

    def action_poll_now(self) -> None:
        self.poll()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.read_only))


def run_console(
    url: str | None = None,
    token: str | None = None,
    refresh: float | None = None,
    read_only: bool = False,
) -> None:
    """Entry point of ``servedeck tui``: flags override ``SERVEDECK_TUI_*`` which override
    the defaults."""
    overrides: dict[str, object] = {
        k: v for k, v in {"url": url, "token": token, "refresh": refresh}.items() if v is not None
    }
    if read_only:
        overrides["read_only"] = True
    # Only the flags given: the others still come from SERVEDECK_TUI_* or the defaults.
    # each override is its field's type (argparse's value for that flag)
    ConsoleApp(ConsoleSettings(**overrides)).run()  # type: ignore[arg-type]
