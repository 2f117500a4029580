"""The one registry of commands: key → description → action.

Bindings, the help screen and the command palette are all built from ``COMMANDS``, so they
cannot disagree. A command that changes the server is marked ``mutates``: in read-only mode
its key does nothing and is not shown (``action_enabled``, used by every screen's
``check_action``), and it gets no help line and no palette entry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

Scope = Literal[
    "app", "main", "request", "editor", "history", "schedules", "guardrail", "tenants", "dialog"
]

SCOPE_TITLES: dict[Scope, str] = {
    "app": "Everywhere",
    "main": "Main screen",
    "request": "Request detail",
    "editor": "Policy editor",
    "history": "Policy history",
    "schedules": "Schedules",
    "guardrail": "Guardrail",
    "tenants": "Tenants",
    "dialog": "Dialogs",
}


@dataclass(frozen=True, slots=True)
class Command:
    id: str
    keys: str
    """Textual key names, comma separated; the first is the one shown."""
    description: str
    action: str
    scope: Scope = "app"
    mutates: bool = False
    help: str = ""
    show: bool = True
    key_display: str | None = None
    priority: bool = False
    in_palette: bool = True

    @property
    def display_key(self) -> str:
        return self.key_display or self.keys.split(",")[0]


COMMANDS: tuple[Command, ...] = (
    Command("help", "f1", "Help", "help", help="Every key and command", key_display="F1"),
    Command(
        "palette",
        "ctrl+p",
        "Commands",
        "command_palette",
        help="Search every command",
        key_display="^p",
        priority=True,
        in_palette=False,
        show=False,
    ),
    Command("pause", "p", "Pause", "toggle_pause", help="Stop or resume polling the server"),
    Command(
        "faster",
        "plus,equals_sign",
        "Faster",
        "refresh_faster",
        help="Poll more often",
        key_display="+",
    ),
    Command("slower", "minus", "Slower", "refresh_slower", help="Poll less often", key_display="-"),
    Command("refresh", "ctrl+r", "Refresh now", "poll_now", help="Poll the server now", show=False),
    Command("quit", "q,ctrl+q", "Quit", "quit", help="Leave the console"),
    Command(
        "filter",
        "slash",
        "Filter",
        "filter",
        scope="main",
        help="Filter requests by id, state, tenant or wait reason (esc clears)",
        key_display="/",
    ),
    Command(
        "clear_filter",
        "escape",
        "Clear filter",
        "clear_filter",
        scope="main",
        help="Clear and hide the request filter",
        show=False,
    ),
    Command(
        "sort", "s", "Sort", "cycle_sort", scope="main", help="Sort requests by the next column"
    ),
    Command(
        "reverse",
        "S",
        "Reverse",
        "reverse_sort",
        scope="main",
        help="Reverse the request sort order",
        show=False,
    ),
    Command(
        "request_detail",
        "d",
        "Detail",
        "request_detail",
        scope="main",
        help="The selected request's timeline (why it waited), and its prompt and output as "
        "it streams (also enter; the text needs a server started with --expose-text)",
    ),
    Command(
        "replicas",
        "f",
        "Replicas",
        "replicas",
        scope="main",
        help="Focus the replicas panel (a server run with --replicas)",
        show=False,
    ),
    Command(
        "edit_policy",
        "e",
        "Edit",
        "edit_policy",
        scope="main",
        mutates=True,
        help="Open the policy editor",
    ),
    Command("history", "h", "History", "history", scope="main", help="Policy versions"),
    Command(
        "tenants",
        "n",
        "Tenants",
        "tenants",
        scope="main",
        help="Each tenant's share of service against its weight, queue and counter",
    ),
    Command(
        "schedules",
        "w",
        "Schedules",
        "schedules",
        scope="main",
        help="Policy windows: next firings and the window in force",
        show=False,
    ),
    Command(
        "guardrail",
        "g",
        "Guardrail",
        "guardrail",
        scope="main",
        help="SLO guardrail: objectives, margin, decisions, kill switch",
        show=False,
    ),
    Command(
        "reclaim",
        "m",
        "Sweep",
        "reclaim",
        scope="main",
        mutates=True,
        help="Run the KV reclaim sweep now (asks first)",
    ),
    Command(
        "demo_load",
        "l",
        "Demo load",
        "demo_load",
        scope="main",
        mutates=True,
        help="Pause or resume the demo load (a server started with --demo-load)",
        show=False,
    ),
    Command(
        "dry_run",
        "ctrl+d",
        "Dry run",
        "dry_run",
        scope="editor",
        help="Validate on the server and show the diff",
    ),
    Command(
        "apply",
        "ctrl+s",
        "Apply",
        "apply",
        scope="editor",
        mutates=True,
        help="Dry run, confirm the diff, then apply",
    ),
    Command(
        "reload_policy",
        "ctrl+l",
        "Reload",
        "reload",
        scope="editor",
        help="Reload the active policy (drops edits)",
    ),
    Command("close_editor", "escape", "Close", "close", scope="editor", help="Back"),
    Command(
        "rollback",
        "r",
        "Roll back",
        "rollback",
        scope="history",
        mutates=True,
        help="Make the selected version active again (asks first)",
    ),
    Command("reload_history", "ctrl+l", "Reload", "reload", scope="history", help="Reload"),
    Command("close_history", "escape", "Close", "close", scope="history", help="Back"),
    Command("close_request", "escape", "Close", "close", scope="request", help="Back"),
    Command("close_schedules", "escape", "Close", "close", scope="schedules", help="Back"),
    Command(
        "kill_guardrail",
        "k",
        "Kill switch",
        "kill_switch",
        scope="guardrail",
        mutates=True,
        help="Turn the guardrail off: mode off, with a reason (asks first)",
    ),
    Command("close_guardrail", "escape", "Close", "close", scope="guardrail", help="Back"),
    Command("close_tenants", "escape", "Close", "close", scope="tenants", help="Back"),
    Command("dismiss", "escape", "Close", "dismiss", scope="dialog", help="Close this dialog"),
)


OPENED_BY: dict[Scope, str] = {
    "request": "request_detail",
    "editor": "edit_policy",
    "history": "history",
    "schedules": "schedules",
    "guardrail": "guardrail",
    "tenants": "tenants",
}
"""Screens reached through a command: when that command is off, so is the whole screen."""


def commands_for(scope: Scope, read_only: bool) -> list[Command]:
    opener = next((c for c in COMMANDS if c.id == OPENED_BY.get(scope)), None)
    if read_only and opener is not None and opener.mutates:
        return []
    return [c for c in COMMANDS if c.scope == scope and not (read_only and c.mutates)]


def bindings_for(scope: Scope) -> list[Binding]:
    """The ``BINDINGS`` of the screen (or app) for ``scope``: every command of the scope.

    Read-only mode is known only per instance, so it does not drop bindings here; it
    disables them through ``check_action`` (see ``action_enabled``)."""
    return [
        Binding(
            c.keys,
            c.action,
            c.description,
            show=c.show,
            key_display=c.key_display,
            priority=c.priority,
            tooltip=c.help,
            id=c.id,
        )
        for c in COMMANDS
        if c.scope == scope
    ]


def mutating_actions() -> frozenset[str]:
    return frozenset(c.action for c in COMMANDS if c.mutates)


def action_enabled(scope: Scope, action: str, read_only: bool) -> bool:
    """Whether ``action`` may run on the screen (or app) of ``scope``.

    Read-only mode takes away every action that changes the server, and every action of a
    screen that only a changing command opens: exactly what ``commands_for`` leaves out.
    Actions the registry does not know (Textual's own, such as focus moves) stay on."""
    if not read_only:
        return True
    if action in mutating_actions():
        return False
    scoped = {c.action for c in COMMANDS if c.scope == scope}
    return action not in scoped or action in {c.action for c in commands_for(scope, read_only)}


class RegistryCommands(Provider):
    """The command palette's view of the registry: app-wide commands plus the calling
    screen's own (a screen names its scope in ``COMMAND_SCOPE``)."""

    def _commands(self) -> list[tuple[Command, bool]]:
        read_only = getattr(self.app, "read_only", True)
        scope = getattr(self.screen, "COMMAND_SCOPE", None)
        found = [(c, False) for c in commands_for(scope, read_only)] if scope else []
        found += [(c, True) for c in commands_for("app", read_only)]
        return [(c, on_app) for c, on_app in found if c.in_palette]

    def _runner(self, command: Command, on_app: bool) -> Callable[[], Awaitable[object]]:
        target = self.app if on_app else self.screen
        return partial(target.run_action, command.action)

    async def discover(self) -> Hits:
        for command, on_app in self._commands():
            yield DiscoveryHit(
                f"{command.description} ({command.display_key})",
                self._runner(command, on_app),
                help=command.help,
            )

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command, on_app in self._commands():
            text = f"{command.description} ({command.display_key})"
            score = max(matcher.match(text), matcher.match(command.help) * 0.8)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(text),
                    self._runner(command, on_app),
                    text=text,
                    help=command.help,
                )
