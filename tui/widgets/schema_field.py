"""One form field generated from a JSON schema property: its input, bounds, source and error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.validation import Integer, Number, Validator
from textual.widgets import Input, Label, Select, Static, Switch

Kind = Literal["integer", "number", "boolean", "string", "enum"]
_INPUT_TYPES: dict[Kind, Literal["integer", "number", "text"]] = {
    "integer": "integer",
    "number": "number",
}
"""The Input's own check for a numeric kind (any other kind types free text)."""


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    path: str
    """Where the server's 422 ``loc`` points (``policy.params.max_batch_size``)."""
    title: str
    kind: Kind
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    default: Any = None
    description: str = ""
    choices: tuple[Any, ...] = ()
    cap: Any = None
    """The engine cap a null value stands for, when the server reports it."""
    null_means: str = "engine cap"
    """What an empty (null) value stands for: the schema's ``x-null`` ("engine cap", "off")."""

    @classmethod
    def from_schema(
        cls, name: str, schema: dict[str, Any], path: str, cap: Any = None
    ) -> FieldSpec:
        variants = schema.get("anyOf") or [schema]
        nullable = any(v.get("type") == "null" for v in variants)
        main: dict[str, Any] = next((v for v in variants if v.get("type") != "null"), {})
        merged = {**main, **{k: v for k, v in schema.items() if k != "anyOf"}}
        kind: Kind = "enum" if "enum" in merged else merged.get("type", "string")
        return cls(
            name=name,
            path=path,
            title=merged.get("title") or name.replace("_", " ").capitalize(),
            kind=kind,
            nullable=nullable,
            minimum=merged.get("minimum", merged.get("exclusiveMinimum")),
            maximum=merged.get("maximum", merged.get("exclusiveMaximum")),
            default=merged.get("default"),
            description=merged.get("description", ""),
            choices=tuple(merged.get("enum", ())),
            cap=cap,
            null_means=merged.get("x-null", "engine cap"),
        )

    def bounds(self) -> str:
        lo, hi = _num(self.minimum), _num(self.maximum)
        if lo is not None and hi is not None:
            text = f"{lo} – {hi}"
        elif lo is not None:
            text = f"≥ {lo}"
        elif hi is not None:
            text = f"≤ {hi}"
        else:
            text = self.kind
        if self.nullable:
            cap = f" ({self.cap})" if self.cap is not None else ""
            text += f", empty = {self.null_means}{cap}"
        return text

    def validators(self) -> list[Validator]:
        if self.kind == "integer":
            return [Integer(minimum=self.minimum, maximum=self.maximum)]
        if self.kind == "number":
            return [Number(minimum=self.minimum, maximum=self.maximum)]
        return []

    def parse(self, text: str) -> Any:
        text = text.strip()
        if not text:
            return None
        if self.kind == "integer":
            return int(text)
        if self.kind == "number":
            return float(text)
        return text


def _num(value: float | None) -> str | None:
    if value is None:
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)


class SchemaField(Vertical):
    error: reactive[str] = reactive("", init=False)

    def __init__(self, spec: FieldSpec, value: Any, source: str | None = None) -> None:
        super().__init__(classes="schema-field", id=f"field-{spec.path.replace('.', '-')}")
        self.spec = spec
        self.initial = value
        self.source = source

    def compose(self) -> ComposeResult:
        spec = self.spec
        with Horizontal(classes="field-head"):
            yield Label(spec.title, classes="field-title", markup=False)
            yield Label(f"[{spec.bounds()}]", classes="field-bounds", markup=False)
            if self.source:
                yield Label(self.source, classes=f"field-source -{self.source}")
        if spec.kind == "boolean":
            yield Switch(bool(self.initial), classes="field-input")
        elif spec.kind == "enum":
            options = [(str(c), c) for c in spec.choices]
            yield Select(
                options,
                value=self.initial,
                allow_blank=spec.nullable,
                classes="field-input",
                compact=True,
            )
        else:
            yield Input(
                "" if self.initial is None else str(self.initial),
                placeholder=spec.null_means if spec.nullable else spec.kind,
                type=_INPUT_TYPES.get(spec.kind, "text"),
                validators=spec.validators(),
                valid_empty=spec.nullable,
                classes="field-input",
                compact=True,
            )
        yield Static("", classes="field-error", markup=False)
        if spec.description:
            yield Label(spec.description, classes="field-help", markup=False)

    def watch_error(self, error: str) -> None:
        self.query_one(".field-error", Static).update(error)
        self.set_class(bool(error), "-error")

    def check(self) -> str:
        """Validate the current input client-side; returns (and shows) the error or ''."""
        self.error = self._client_error()
        return self.error

    def _client_error(self) -> str:
        if self.spec.kind in ("boolean", "enum"):
            return ""
        field_input = self.query_one(Input)
        if not field_input.value.strip():
            return "" if self.spec.nullable else "A value is required."
        result = field_input.validate(field_input.value)
        if result is not None and not result.is_valid:
            return " ".join(result.failure_descriptions)
        return ""

    @property
    def value(self) -> Any:
        if self.spec.kind == "boolean":
            return self.query_one(Switch).value
        if self.spec.kind == "enum":
            chosen = self.query_one(Select).value
            return None if chosen is Select.BLANK else chosen
        return self.spec.parse(self.query_one(Input).value)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.check()
