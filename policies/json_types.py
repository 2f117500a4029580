"""The JSON types a policy's params take: stricter than pydantic's lax mode, as JSON Schema
types them (``"16"`` or ``true`` is no integer, ``1`` no boolean, ``16.0`` an integer that
becomes ``16``), so a stored or PUT spec is refused or taken exactly as its schema says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

JsonType = Literal["integer", "number", "boolean", "null"]
_IS_JSON: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def json_typed(*kinds: JsonType) -> BeforeValidator:
    """A param takes these JSON types only (stricter than pydantic's lax mode, as JSON Schema
    types them): ``"16"`` or ``true`` is no integer and ``1`` no boolean, while ``16.0`` is an
    integer (and becomes ``16``). Bounds and engine caps are checked after."""
    allowed = " or ".join(sorted(kinds))

    def check(value: Any) -> Any:
        if not any(_IS_JSON[kind](value) for kind in kinds):
            raise PydanticCustomError(
                "json_type", "Input should be of JSON type {types}", {"types": allowed}
            )
        if isinstance(value, float) and "integer" in kinds and "number" not in kinds:
            return int(value)
        return value

    return BeforeValidator(check)


JsonInt = Annotated[int, json_typed("integer")]
JsonIntOrNull = Annotated[int | None, json_typed("integer", "null")]
JsonNumber = Annotated[float, json_typed("number")]
JsonNumberOrNull = Annotated[float | None, json_typed("number", "null")]
JsonBool = Annotated[bool, json_typed("boolean")]
