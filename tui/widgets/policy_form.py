"""The params form of one policy, generated from its JSON schema."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label

from tui.widgets.schema_field import FieldSpec, SchemaField


class PolicyForm(Vertical):
    def __init__(
        self,
        policy: str,
        schema: dict[str, Any],
        stored: dict[str, Any],
        sources: dict[str, str],
        engine_limits: dict[str, Any],
    ) -> None:
        super().__init__(id="policy-form")
        self.policy = policy
        self.stored = stored
        """Params the active version sets explicitly; the rest are at their defaults."""
        self.specs = [
            FieldSpec.from_schema(name, prop, f"policy.params.{name}", cap=engine_limits.get(name))
            for name, prop in schema.get("properties", {}).items()
        ]
        self.sources = sources

    def compose(self) -> ComposeResult:
        if not self.specs:
            yield Label("This policy has no params.", classes="field-help")
        for spec in self.specs:
            value = self.stored.get(spec.name, spec.default)
            yield SchemaField(spec, value, self.sources.get(spec.path))

    @property
    def fields(self) -> list[SchemaField]:
        return list(self.query(SchemaField))

    def check(self) -> list[str]:
        """Client-side validation of every field; the paths that failed."""
        return [f.spec.path for f in self.fields if f.check()]

    def params(self) -> dict[str, Any]:
        """What to send: the params set explicitly before and any that now differ from
        their default (so untouched defaults stay defaults on the server)."""
        return {
            f.spec.name: f.value
            for f in self.fields
            if f.spec.name in self.stored or f.value != f.spec.default
        }
