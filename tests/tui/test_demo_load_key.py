"""The console's `l` pauses the server's demo load and resumes it at the rate it had; a
read-only console cannot; a server without --demo-load says so (real servers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import tui.app
from tests.control.support import ADMIN, TOKEN, ServerProcess
from tests.tui.conftest import wait_for
from tui.app import ConsoleApp
from tui.config import ConsoleSettings

SIZE = (120, 40)


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["--admin-token", TOKEN, "--demo-load", "3"]
    process = ServerProcess(tiny_model_dir, tmp_path_factory.mktemp("demo"), args, {})
    process.start()
    yield process.url
    process.stop()


def rate(url: str) -> float:
    return httpx.get(f"{url}/admin/demo-load", headers=ADMIN, timeout=10).json()["rate"]


class NotedConsole(ConsoleApp):
    """The console, keeping each notification's message (``notify`` is public API)."""

    CSS_PATH = Path(tui.app.__file__).with_name("console.tcss")  # relative to this file else

    def __init__(self, settings: ConsoleSettings) -> None:
        super().__init__(settings)
        self.noted: list[str] = []

    def notify(self, message: str, **kwargs: Any) -> None:
        self.noted.append(message)
        super().notify(message, **kwargs)


def console(url: str, read_only: bool = False) -> NotedConsole:
    return NotedConsole(ConsoleSettings(url=url, token=TOKEN, refresh=3600, read_only=read_only))


async def test_l_pauses_and_resumes_the_demo_load(server: str) -> None:
    assert rate(server) == 3
    app = console(server)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        await wait_for(pilot, lambda: rate(server) == 0, what="paused")
        await wait_for(pilot, lambda: "Demo load paused" in app.noted, what="the notice")
        await pilot.press("l")
        await wait_for(pilot, lambda: rate(server) == 3, what="resumed at 3/s")


async def test_read_only_console_leaves_it(server: str) -> None:
    app = console(server, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        await pilot.pause(0.5)
    assert rate(server) == 3


async def test_without_demo_load_the_console_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    process = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN], {})
    process.start()
    try:
        app = console(process.url)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("l")
            await wait_for(
                pilot,
                lambda: any("--demo-load" in message for message in app.noted),
                what="the notification",
            )
    finally:
        process.stop()
