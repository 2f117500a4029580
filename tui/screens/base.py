"""What every console screen shares: bindings from the command registry for its scope, and
no way to run a mutating action in read-only mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeVar

from textual.binding import BindingsMap
from textual.screen import ModalScreen, Screen

from tui.commands import Scope, bindings_for, mutating_actions

if TYPE_CHECKING:
    from tui.app import ConsoleApp


def _registry_bindings(scope: Scope, read_only: bool) -> BindingsMap:
    # Bindings depend on read-only mode, known only at run time, so they are built per
    # instance from the registry instead of the BINDINGS class variable.
    return BindingsMap(bindings_for(scope, read_only))


class ConsoleScreen(Screen[None]):
    COMMAND_SCOPE: ClassVar[Scope]

    def __init__(self, read_only: bool, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.read_only = read_only
        self._bindings = _registry_bindings(self.COMMAND_SCOPE, read_only)

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.read_only and action in mutating_actions())


T = TypeVar("T")


class DialogScreen(ModalScreen[T]):
    COMMAND_SCOPE: ClassVar[Scope] = "dialog"

    def __init__(self, read_only: bool = False, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._bindings = _registry_bindings("dialog", read_only)
