"""Keys from the command registry through Textual's public binding API.

A screen (or the app) names its ``COMMAND_SCOPE``; this mixin makes the class's ``BINDINGS``
the registry's commands of that scope when the class is created, and its ``check_action``
says which of them read-only mode takes away. Textual skips a key whose action is disabled
(the key falls through as if unbound) and hides it from the footer. Nothing private is
touched, so a Textual upgrade that keeps the documented ``BINDINGS`` and ``check_action``
keeps the keys. Textual's own defaults (``tab`` moves focus, ``ctrl+c`` copies) stay.
"""

from __future__ import annotations

from typing import Any, ClassVar

from textual.binding import BindingType

from tui.commands import Scope, action_enabled, bindings_for


class RegistryBindings:
    """Mix in before Textual's ``Screen``/``App``; the instance sets ``read_only`` before
    Textual may ask ``check_action``."""

    COMMAND_SCOPE: ClassVar[Scope]
    BINDINGS: ClassVar[list[BindingType]]
    read_only: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Runs before Textual's own __init_subclass__ merges BINDINGS along the MRO.
        if "BINDINGS" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: keys come from tui/commands.py, not BINDINGS")
        if "COMMAND_SCOPE" in cls.__dict__:
            cls.BINDINGS = [*bindings_for(cls.COMMAND_SCOPE)]
        super().__init_subclass__(**kwargs)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action_enabled(self.COMMAND_SCOPE, action, self.read_only)
