"""OpenAI request fields that servedeck accepts only at their default, shared by the
completions and chat request bodies (inherit ``UnsupportedFields``).

Load testers and SDKs send these fields with their default values (``presence_penalty: 0``,
``best_of: 1``, ``logit_bias: {}``), so a default is accepted and does nothing. A value that
asks for a behaviour servedeck does not have is refused with a 400 naming the field, never
silently ignored: the client would otherwise get an answer to a question it did not ask. The
JSON Schema says the same (``maximum``, ``maxItems``, ``maxProperties``, ``enum``), so a
client or a fuzzer reading ``/openapi.json`` never sends a refused value by accident.
``response_format`` is served (control/api/structured.py); it sits here with the fields
OpenAI's two bodies share. ``tools`` are the chat body's own (control/chat/schemas.py; a
completion refuses them: control/schemas/completions.py).
``OwnerFields`` are the two that say whose a request is: ``user`` (OpenAI's) and
``priority`` (vLLM's).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic_core import PydanticCustomError

from control.schemas.response_format import ResponseFormat, StructuredOutputs
from engine.tenants import DEFAULT_PRIORITY, MAX_PRIORITY, MAX_TENANT_NAME, MIN_PRIORITY


# Any: a before-validator's input, the client's JSON
def _json_integer(value: Any) -> Any:
    """JSON Schema's integer includes ``1.0``: an integral float becomes its int (a bool, a
    string or ``2.5`` is still refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[StrictInt, BeforeValidator(_json_integer)]
"""An integer as JSON Schema's ``integer`` means it: ``3`` or ``3.0``, never ``true``/``"3"``.
(Here, below control/schemas/completions.py and control/chat/schemas.py, so both request bodies
share it.)"""


def _refuse(field: str, accepted: str) -> PydanticCustomError:
    return PydanticCustomError(
        "unsupported_value", "{field} is not supported: only {accepted} is accepted", locals()
    )


class OwnerFields(BaseModel):
    user: StrictStr | None = Field(
        None,
        description=(
            "The request's tenant where the API key names none (advisory: a client may send "
            f"any; the first {MAX_TENANT_NAME} characters count). A key named in "
            "--api-key-file is its tenant whatever this says."
        ),
    )
    priority: JsonInt = Field(
        DEFAULT_PRIORITY,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description=(
            "Lower is served earlier (vLLM's meaning), under the priority queue discipline "
            "(and within a tenant under fair); the opposite of a schedule's priority, where "
            "higher wins an overlap."
        ),
    )


class UnsupportedFields(OwnerFields):
    best_of: JsonInt | None = Field(
        None,
        description="Only 1 (or null) is accepted: best-of-n selection is not supported.",
        json_schema_extra={"minimum": 1, "maximum": 1},
    )
    presence_penalty: StrictFloat | None = Field(
        None,
        description="Only 0 (or null) is accepted: penalties are not supported.",
        json_schema_extra={"minimum": 0, "maximum": 0},
    )
    frequency_penalty: StrictFloat | None = Field(
        None,
        description="Only 0 (or null) is accepted: penalties are not supported.",
        json_schema_extra={"minimum": 0, "maximum": 0},
    )
    # Any: OpenAI's fields this server refuses unless empty (never read): arbitrary JSON
    logit_bias: dict[str, Any] | None = Field(
        None,
        description="Only {} (or null) is accepted: logit bias is not supported.",
        json_schema_extra={"maxProperties": 0},
    )
    functions: list[Any] | None = Field(
        None,
        description="Only [] (or null) is accepted: function calls are not supported.",
        json_schema_extra={"maxItems": 0},
    )
    response_format: ResponseFormat | None = Field(
        None,
        description='Structured output: {"type": "text"} (the default), {"type": '
        '"json_object"} or {"type": "json_schema", "json_schema": {"name", "schema", '
        '"strict"}}; every token is constrained by a grammar, so the answer parses and '
        "follows the schema (docs/api.md).",
    )
    structured_outputs: StructuredOutputs | None = Field(
        None,
        description="vLLM's extension: one of json (a JSON Schema), regex (the whole answer "
        "matches it), choice (the answer is one of the strings) or grammar (llguidance's "
        "lark); not with response_format.",
    )

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise _refuse("best_of", "1")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    # Any: pydantic's ValidationInfo as it passes it; the value the client's JSON
    def _no_penalty(cls, value: float | None, info: Any) -> float | None:
        if value is not None and value != 0:
            raise _refuse(info.field_name, "0")
        return value

    @field_validator("logit_bias", "functions")
    @classmethod
    def _empty(cls, value: Any, info: Any) -> Any:
        if value:
            raise _refuse(info.field_name, "an empty value")
        return value
