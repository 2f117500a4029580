"""Ask before anything that changes the server; optionally take a reason with the answer."""

from __future__ import annotations

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from tui.screens.base import DialogScreen


class ConfirmScreen(DialogScreen[str | None]):
    """Dismisses with the reason ('' when none is asked) on confirm, ``None`` on cancel."""

    def __init__(
        self,
        title: str,
        body: RenderableType,
        confirm_label: str = "Confirm",
        *,
        reason: str | None = None,
        reason_required: bool = False,
    ) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.confirm_label = confirm_label
        self.reason = reason
        self.reason_required = reason_required

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.body, classes="dialog-body", markup=False)
            if self.reason is not None:
                placeholder = "Reason (required)" if self.reason_required else "Reason"
                yield Input(self.reason, placeholder=placeholder, id="confirm-reason")
            yield Static("", id="confirm-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.confirm_label, variant="warning", id="confirm-yes")
                yield Button("Cancel", id="confirm-no")

    def on_mount(self) -> None:
        target = "#confirm-reason" if self.reason is not None else "#confirm-no"
        self.query_one(target).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "confirm-yes":
            self._confirm()
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._confirm()

    def _confirm(self) -> None:
        if self.reason is None:
            self.dismiss("")
            return
        reason = self.query_one("#confirm-reason", Input).value.strip()
        if self.reason_required and not reason:
            self.query_one("#confirm-error", Static).update("A reason is required.")
            return
        self.dismiss(reason)
