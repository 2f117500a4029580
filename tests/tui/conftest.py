"""Fixtures of the console tests: recorded responses, a real server process, waiting helpers."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from bench.child_server import free_port
from tests.tui.recorded import RecordedServer, state_series
from tui.app import ConsoleApp
from tui.config import ConsoleSettings

SERVE = Path(sys.executable).parent / "servedeck"
ADMIN_TOKEN = "tui-test-admin-token-7c2e"  # the server refuses tokens under 16 chars


async def wait_for(
    pilot: Pilot, predicate: Callable[[], object], timeout: float = 10.0, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await pilot.pause(0.02)


def quiet_settings(**overrides: object) -> ConsoleSettings:
    """Settings whose timer never fires within a test: polls happen only when asked."""
    values: dict[str, object] = {"url": "http://unused", "refresh": 3600, "max_refresh": 3600}
    values.update(overrides)
    return ConsoleSettings(**values)  # type: ignore[arg-type]


def active_actions(app: ConsoleApp, namespace: object | None = None) -> set[str]:
    """Actions whose keys work now and show in the footer (Textual's public
    ``Screen.active_bindings``), optionally only those bound on ``namespace``."""
    return {
        active.binding.action
        for active in app.screen.active_bindings.values()
        if namespace is None or active.node is namespace
    }


async def poll_times(pilot: Pilot, app: ConsoleApp, count: int) -> None:
    """Let the app finish exactly ``count`` successful polls (the first one starts by itself)."""
    await wait_for(pilot, lambda: app.polls_ok >= 1, what="first poll")
    while app.polls_ok < count:
        target = app.polls_ok + 1
        app.poll()
        await wait_for(pilot, lambda n=target: app.polls_ok >= n, what="poll")
    await pilot.pause()


@pytest.fixture
def snap_compare(snap_compare: Callable[..., bool]) -> Callable[..., bool]:
    """The plugin's ``snap_compare``, with every input's cursor steady before the picture: a
    focused Input blinks every 0.5 s, so a slow machine could take it either way."""

    def compare(app: ConsoleApp, *, run_before: Callable[[Pilot], object] | None = None, **kw):
        async def steady(pilot: Pilot) -> None:
            if run_before is not None:
                await run_before(pilot)  # type: ignore[misc]
            for field in pilot.app.screen.query(Input):
                field.cursor_blink = False  # Textual's public switch; the cursor stays hidden
            await pilot.pause()

        return snap_compare(app, run_before=steady, **kw)

    return compare


@pytest.fixture
def recorded() -> RecordedServer:
    return RecordedServer()


@pytest.fixture
def recorded_series() -> RecordedServer:
    return RecordedServer(state_series(6))


class LiveServer:
    """``servedeck serve`` as a subprocess; stop and start again on the same port and db."""

    def __init__(self, model: Path, db: Path, log: Path) -> None:
        self.model, self.db, self.log_path = model, db, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> None:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                str(SERVE),
                "serve",
                "--model",
                str(self.model),
                "--port",
                str(self.port),
                "--db",
                str(self.db),
                "--admin-token",
                ADMIN_TOKEN,
                "--num-threads",
                "1",
                "--num-kv-blocks",
                "256",
                "--log-level",
                "warning",
                "--expose-text",  # the detail view's source (tests/tui/test_live_server.py)
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy in {timeout}s: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def admin(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        url = f"{self.url}/admin{path}"
        return httpx.request(method, url, headers=headers, timeout=10, **kwargs)  # type: ignore[arg-type]

    def policy(self) -> dict:
        response = self.admin("GET", "/policy")
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def live_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("live")
    server = LiveServer(tiny_model_dir, root / "servedeck.db", root / "server.log")
    server.start()
    yield server
    server.stop()


def send_load(url: str, requests: int, concurrency: int, max_tokens: int) -> threading.Thread:
    """A bounded burst of completions to ``url`` (127.0.0.1 only) in a background thread."""
    assert url.startswith("http://127.0.0.1:")
    body = {"prompt": "the quick brown fox " * 6, "max_tokens": max_tokens, "ignore_eos": True}

    def one(i: int) -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/v1/completions", json={**body, "seed": i}, timeout=120)

    def run() -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(requests)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
