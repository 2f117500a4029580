"""The one command registry feeds bindings, help and palette; read-only removes changers."""

from __future__ import annotations

from textual.command import CommandPalette

from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer
from tui.app import ConsoleApp, MainScreen
from tui.commands import COMMANDS, RegistryCommands, commands_for, mutating_actions
from tui.screens.base import ConsoleScreen, DialogScreen
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.policy_editor import PolicyEditorScreen

SCREENS = {
    "app": ConsoleApp,
    "main": MainScreen,
    "editor": PolicyEditorScreen,
    "history": HistoryScreen,
    "dialog": DialogScreen,
}


def test_every_command_names_an_action_of_its_scope() -> None:
    for command in COMMANDS:
        assert hasattr(SCREENS[command.scope], f"action_{command.action}"), command


def test_no_key_means_two_things_in_one_place() -> None:
    for scope in ("main", "editor", "history", "dialog"):
        keys = [
            key.strip()
            for c in commands_for(scope, read_only=False) + commands_for("app", read_only=False)
            for key in c.keys.split(",")
        ]
        assert len(keys) == len(set(keys)), scope


def test_registry_marks_every_server_change() -> None:
    assert mutating_actions() == {"edit_policy", "reclaim", "apply", "rollback"}


def _bound_actions(node: ConsoleApp | ConsoleScreen) -> set[str]:
    return {binding.action for _, binding in node._bindings}


async def test_bindings_help_and_palette_come_from_the_registry() -> None:
    app = ConsoleApp(quiet_settings(), client=RecordedServer().client())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        assert _bound_actions(app) == {c.action for c in commands_for("app", False)}
        assert _bound_actions(app.screen) == {c.action for c in commands_for("main", False)}
        hits = [hit async for hit in RegistryCommands(app.screen).discover()]
        shown = {str(hit.display) for hit in hits}
        for command in commands_for("main", False) + commands_for("app", False):
            if command.in_palette:
                assert f"{command.description} ({command.display_key})" in shown
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(str(s.render()) for s in app.screen.query(".help-lines"))
        for command in COMMANDS:
            assert command.help in text
        await pilot.press("escape")
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"sweep")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen")


async def test_read_only_binds_shows_and_offers_no_change() -> None:
    server = RecordedServer()
    app = ConsoleApp(quiet_settings(read_only=True), client=server.client(read_only=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        changers = mutating_actions()
        assert not _bound_actions(app) & changers
        assert not _bound_actions(app.screen) & changers
        hits = [hit async for hit in RegistryCommands(app.screen).discover()]
        assert not any(
            c.description in str(hit.display) for hit in hits for c in COMMANDS if c.mutates
        )
        for command in COMMANDS:
            for key in command.keys.split(","):
                if key not in ("q", "ctrl+q", "ctrl+p"):
                    await pilot.press(key)
                    await pilot.pause()
            while len(app.screen_stack) > 1:
                app.pop_screen()
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        assert not _bound_actions(app.screen) & changers
        assert not app.screen.query("Button")
        await pilot.press("r")
        assert server.changes() == []
        assert not any(r.method != "GET" for r in server.requests)
