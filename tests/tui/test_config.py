"""Settings precedence, the keymap, the threshold helper and the CLI entry point."""

from __future__ import annotations

import inspect

import pytest

from tests.tui.conftest import poll_times, quiet_settings
from tests.tui.recorded import RecordedServer
from tui import app as app_module
from tui.app import ConsoleApp, run_console
from tui.config import ConsoleSettings
from tui.formatting import duration, level, seconds


def test_environment_overrides_defaults_and_flags_override_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVEDECK_TUI_URL", "http://10.0.0.5:9000")
    monkeypatch.setenv("SERVEDECK_TUI_REFRESH", "5")
    monkeypatch.setenv("SERVEDECK_TUI_READ_ONLY", "true")
    assert ConsoleSettings().url == "http://10.0.0.5:9000"
    captured: list[ConsoleApp] = []
    monkeypatch.setattr(ConsoleApp, "run", lambda self: captured.append(self))
    run_console(url="http://127.0.0.1:8000", token="T", refresh=2.0, read_only=False)
    settings = captured[0].settings
    assert (settings.url, settings.token, settings.refresh) == ("http://127.0.0.1:8000", "T", 2.0)
    assert settings.read_only  # the flag can only add read-only, never remove it
    assert captured[0].client.read_only


def test_run_console_signature_is_what_the_cli_calls() -> None:
    params = inspect.signature(app_module.run_console).parameters
    assert list(params) == ["url", "token", "refresh", "read_only"]


def test_refresh_is_clamped_to_its_limits() -> None:
    assert ConsoleSettings(refresh=0.01).refresh == 0.25
    assert ConsoleSettings(refresh=999).refresh == 30.0


def test_one_threshold_helper_colours_every_latency() -> None:
    assert [level(v, 0.5, 2.0) for v in (None, 0.1, 0.5, 1.9, 2.0)] == [
        "none",
        "ok",
        "warn",
        "warn",
        "crit",
    ]
    assert (seconds(0.18), seconds(2.1), seconds(None)) == ("180 ms", "2.10 s", "—")
    assert (duration(42), duration(812.5), duration(7380), duration(3 * 86400 + 4 * 3600)) == (
        "42s",
        "13m 32s",
        "2h 03m",
        "3d 04h",
    )


async def test_keys_can_be_remapped_by_command_id() -> None:
    app = ConsoleApp(quiet_settings(keymap={"pause": "space"}), client=RecordedServer().client())
    async with app.run_test() as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("space")
        assert app.paused
        await pilot.press("p")
        assert app.paused  # p no longer pauses


def test_console_imports_nothing_of_the_server_side() -> None:
    import subprocess
    import sys

    ours = ["serving", "engine", "control", "policies", "kernels", "bench", "migrations", "torch"]
    code = (
        "import sys, tui.app, tui.client\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {ours!r}]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
