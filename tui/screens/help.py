"""Every key, grouped by where it works, straight from the command registry."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.keys import format_key
from textual.widgets import Button, Label, Static

from tui.commands import SCOPE_TITLES, commands_for
from tui.screens.base import DialogScreen


class HelpScreen(DialogScreen[None]):
    def __init__(self, read_only: bool) -> None:
        super().__init__(read_only)
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="help"):
            title = "Keys"
            if self.read_only:
                title += " (read-only: commands that change the server are off)"
            yield Label(title, classes="dialog-title")
            for scope, heading in SCOPE_TITLES.items():
                commands = commands_for(scope, self.read_only)
                if not commands:
                    continue
                yield Label(heading, classes="help-scope")
                lines = [
                    Content.assemble(
                        (f"{self._keys(c.keys, c.key_display):<14}", "bold $text-accent"),
                        f"{c.description:<14}",
                        (c.help, "$text-muted"),
                    )
                    for c in commands
                ]
                yield Static(Content("\n").join(lines), classes="help-lines")
            yield Label(
                "Ctrl+P opens the command palette with the same commands.", classes="field-help"
            )
            yield Button("Close", id="help-close")

    @staticmethod
    def _keys(keys: str, display: str | None) -> str:
        shown = [format_key(k.strip()) for k in keys.split(",")]
        if display:
            shown[0] = display
        return " / ".join(shown)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)
