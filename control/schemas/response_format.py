"""``response_format``, as OpenAI defines it for ``/v1/chat/completions`` (and servedeck, as
vLLM does, for ``/v1/completions`` too): ``{"type": "text"}`` (the default: nothing
constrained), ``{"type": "json_object"}`` (any JSON object) or ``{"type": "json_schema",
"json_schema": {"name", "description", "schema", "strict"}}`` (JSON valid against the schema).

One model with an optional ``json_schema`` rather than a union on ``type``, so a refusal names
the field as the request spells it (``response_format.json_schema.name``, never pydantic's
union tag in between); the route says ``json_schema`` is required with its type
(control/api/structured.py), where the schema is also bounded and compiled.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator
from pydantic.json_schema import JsonDict

SCHEMA_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
"""OpenAI's rule for ``json_schema.name``."""
MAX_REGEX_CHARS = 1024
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 256
MAX_GRAMMAR_CHARS = 16 * 1024


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: StrictStr = Field(
        pattern=SCHEMA_NAME_PATTERN,
        description="The format's name: letters, digits, _ and -, at most 64.",
    )
    description: StrictStr | None = Field(None, description="Not shown to the model.")
    schema_: dict[str, Any] | None = Field(  # Any: a user's JSON Schema, arbitrary JSON
        None,
        alias="schema",
        description="A JSON Schema object. Absent: any JSON value. Keywords the grammar "
        "cannot enforce (uniqueItems, contains, not, if/then/else, dependentRequired, ...) "
        "are refused by name; bounded in size and nesting (server limits).",
    )
    strict: StrictBool | None = Field(
        None,
        description="Accepted either way: the output always follows the schema (a grammar "
        "constrains every token).",
    )


JSON_SCHEMA_NEEDS_ITS_SCHEMA: JsonDict = {
    "if": {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]},
    "then": {"properties": {"json_schema": {"type": "object"}}, "required": ["json_schema"]},
}
"""The rule across two fields, in JSON Schema (the route refuses the rest with 400)."""
STRUCTURED_OUTPUT_KEYS = ("json", "regex", "choice", "grammar")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(json_schema_extra=JSON_SCHEMA_NEEDS_ITS_SCHEMA)

    type: Literal["text", "json_object", "json_schema"] = Field(
        description="text: unconstrained; json_object: any JSON object; json_schema: JSON "
        "valid against json_schema.schema."
    )
    json_schema: JsonSchemaFormat | None = Field(
        None, description="Required with type json_schema (and read only then)."
    )


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` extra field (the openai client's ``extra_body``): one of
    ``json`` (a JSON Schema, as ``response_format``'s), ``regex`` (the whole answer matches it;
    Rust's regex syntax: no lookaround, no backreferences), ``choice`` (the answer is one of
    the strings) or ``grammar`` (a grammar in llguidance's lark dialect). vLLM's other keys
    (``json_object``, ``structural_tag``, ...) are refused by name, never ignored."""

    model_config = ConfigDict(
        populate_by_name=True,
        extra="forbid",
        json_schema_extra={"maxProperties": 1},
    )

    json_: dict[str, Any] | None = Field(  # Any: a user's JSON Schema, arbitrary JSON
        None, alias="json", description="A JSON Schema object the answer follows."
    )
    regex: StrictStr | None = Field(
        None,
        min_length=1,
        max_length=MAX_REGEX_CHARS,
        description="The whole answer matches it (Rust regex syntax).",
    )
    choice: list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_CHOICE_CHARS)]] | None = (
        Field(None, min_length=1, max_length=MAX_CHOICES, description="The answer is one of them.")
    )
    grammar: StrictStr | None = Field(
        None,
        min_length=1,
        max_length=MAX_GRAMMAR_CHARS,
        description="The answer matches this grammar: llguidance's lark dialect (a start "
        "rule, quoted strings, /regex/ terminals, %json {schema} rules).",
    )

    @model_validator(mode="after")
    def _one_of(self) -> StructuredOutputs:
        given = [key for key in STRUCTURED_OUTPUT_KEYS if _alias(key) in self.model_fields_set]
        if len(given) > 1:
            raise ValueError(
                f"structured_outputs takes one of json, regex, choice, grammar, not {given}"
            )
        return self


def _alias(key: str) -> str:
    return "json_" if key == "json" else key
