"""The one command registry feeds bindings, help and palette; read-only removes changers."""

from __future__ import annotations

import pytest
from textual.command import CommandPalette

from tests.tui.conftest import active_actions, poll_times, quiet_settings, wait_for
from tests.tui.recorded import RecordedServer
from tui.app import ConsoleApp, MainScreen
from tui.commands import (
    COMMANDS,
    RegistryCommands,
    action_enabled,
    bindings_for,
    commands_for,
    mutating_actions,
)
from tui.screens.base import ConsoleScreen, DialogScreen
from tui.screens.confirm import ConfirmScreen
from tui.screens.guardrail import GuardrailScreen
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.policy_editor import PolicyEditorScreen
from tui.screens.request_detail import RequestDetailScreen
from tui.screens.schedules import SchedulesScreen
from tui.screens.tenants import TenantsScreen

SCREENS = {
    "app": ConsoleApp,
    "main": MainScreen,
    "request": RequestDetailScreen,
    "editor": PolicyEditorScreen,
    "history": HistoryScreen,
    "schedules": SchedulesScreen,
    "guardrail": GuardrailScreen,
    "tenants": TenantsScreen,
    "dialog": DialogScreen,
}


def test_every_command_names_an_action_of_its_scope() -> None:
    for command in COMMANDS:
        assert hasattr(SCREENS[command.scope], f"action_{command.action}"), command


def test_no_key_means_two_things_in_one_place() -> None:
    for scope in (
        "main",
        "request",
        "editor",
        "history",
        "schedules",
        "guardrail",
        "tenants",
        "dialog",
    ):
        keys = [
            key.strip()
            for c in commands_for(scope, read_only=False) + commands_for("app", read_only=False)
            for key in c.keys.split(",")
        ]
        assert len(keys) == len(set(keys)), scope


def test_registry_marks_every_server_change() -> None:
    assert mutating_actions() == {
        "edit_policy", "reclaim", "apply", "rollback", "kill_switch", "demo_load",
    }  # fmt: skip


def test_every_screen_declares_its_registry_keys_as_bindings() -> None:
    for scope, cls in SCREENS.items():
        assert bindings_for(scope) == cls.BINDINGS, scope
    assert ConfirmScreen.BINDINGS == HelpScreen.BINDINGS == bindings_for("dialog")


def test_a_screen_cannot_bind_keys_outside_the_registry() -> None:
    with pytest.raises(TypeError, match=r"tui/commands\.py"):

        class Rogue(ConsoleScreen):
            COMMAND_SCOPE = "main"
            BINDINGS = []  # noqa: RUF012


def test_read_only_disables_changers_and_every_key_of_a_screen_only_a_changer_opens() -> None:
    assert all(action_enabled(c.scope, c.action, read_only=False) for c in COMMANDS)
    for command in COMMANDS:
        enabled = action_enabled(command.scope, command.action, read_only=True)
        assert enabled == (command in commands_for(command.scope, read_only=True)), command
    assert not action_enabled("editor", "close", read_only=True)  # opened only by "edit"
    assert action_enabled("history", "close", read_only=True)
    assert action_enabled("main", "app.focus_next", read_only=True)  # Textual's own keys


async def test_bindings_help_and_palette_come_from_the_registry() -> None:
    app = ConsoleApp(quiet_settings(), client=RecordedServer().client())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        registry = commands_for("app", False) + commands_for("main", False)
        assert {c.action for c in commands_for("app", False)} <= active_actions(app, app)
        assert {c.action for c in commands_for("main", False)} <= active_actions(app, app.screen)
        in_footer = {
            a.binding.action for a in app.screen.active_bindings.values() if a.binding.show
        }
        assert in_footer == {c.action for c in registry if c.show}
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
        assert not active_actions(app) & changers
        main = {c.action for c in commands_for("main", False)}
        assert active_actions(app, app.screen) & main == {
            c.action for c in commands_for("main", True)
        }
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
        assert not active_actions(app) & changers
        assert not app.screen.query("Button")
        await pilot.press("r")
        assert server.changes() == []
        assert not any(r.method != "GET" for r in server.requests)


async def test_tab_moves_focus_through_the_editor_form() -> None:
    """Screens keep Textual's own keys beside the registry's: tab walks the form's fields."""
    app = ConsoleApp(quiet_settings(), client=RecordedServer().client())
    async with app.run_test(size=(120, 40)) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen))
        await pilot.pause()
        seen = []
        for _ in range(4):
            seen.append(app.screen.focused)
            await pilot.press("tab")
            await pilot.pause()
        assert None not in seen and len(set(map(id, seen))) == 4, seen
