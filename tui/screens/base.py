"""What every console screen shares: bindings from the command registry for its scope, and
no way to run a mutating action in read-only mode (both from ``RegistryBindings``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeVar

from textual.screen import ModalScreen, Screen

from tui.bindings import RegistryBindings
from tui.commands import Scope

if TYPE_CHECKING:
    from tui.app import ConsoleApp


class ConsoleScreen(RegistryBindings, Screen[None]):
    """A full screen; a subclass names its ``COMMAND_SCOPE`` and gets that scope's keys."""

    def __init__(self, read_only: bool) -> None:
        self.read_only = read_only
        super().__init__()

    @property
    def console(self) -> ConsoleApp:
        # Screen.app is an App of unknown type; every console screen is pushed by ConsoleApp.
        return self.app  # type: ignore[return-value]


T = TypeVar("T")


class DialogScreen(RegistryBindings, ModalScreen[T]):
    COMMAND_SCOPE: ClassVar[Scope] = "dialog"

    def __init__(self, read_only: bool = False) -> None:
        self.read_only = read_only
        super().__init__()
