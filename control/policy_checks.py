"""Checks of a policy change that pydantic alone does not make, and pydantic's errors in the
JSON-safe, ``loc``-prefixed form the admin API answers with."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from policies.base import PolicySpec
from policies.registry import params_schemas


class SettingsInvalid(ValueError):
    """Pydantic-style errors (``loc`` relative to the request body) naming every bad field."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def spec_or_none(raw: Any) -> PolicySpec | None:
    if not isinstance(raw, dict) or raw.get("policy") is None:
        return None
    try:
        return PolicySpec.model_validate(raw["policy"])
    except ValidationError:
        return None


@functools.cache
def _param_types(policy: str) -> dict[str, set[str]]:
    """Each param's JSON types, as the published params schema gives them."""
    fields = params_schemas()[policy]["properties"]
    return {
        name: {typed.get("type", "") for typed in field.get("anyOf", [field])}
        for name, field in fields.items()
    }


def param_type_errors(spec: PolicySpec) -> list[dict[str, Any]]:
    """Params as JSON Schema types them, stricter than pydantic's lax mode: ``"16"`` or
    ``true`` is no integer and ``1`` no boolean, while ``16.0`` is an integer. Unknown
    params are left to the params model (it names them)."""
    errors = []
    types = _param_types(spec.name)
    for name, value in spec.params.items():
        allowed = types.get(name)
        if allowed is not None and not _has_json_type(value, allowed):
            errors.append(
                {
                    "type": "json_type",
                    "loc": ("policy", "params", name),
                    "msg": f"Input should be of JSON type {' or '.join(sorted(allowed))}",
                    "input": value if is_json(value) else repr(value),
                }
            )
    return errors


def _has_json_type(value: Any, allowed: set[str]) -> bool:
    if value is None:
        return "null" in allowed
    if isinstance(value, bool):
        return "boolean" in allowed
    if isinstance(value, int):
        return bool(allowed & {"integer", "number"})
    if isinstance(value, float):
        return "number" in allowed or ("integer" in allowed and value.is_integer())
    return isinstance(value, str) and "string" in allowed


def pydantic_errors(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Pydantic's error dicts, JSON-safe, ``loc`` prefixed."""
    errors = []
    for error in exc.errors(include_url=False):
        entry: dict[str, Any] = {
            "type": error["type"],
            "loc": (*prefix, *error["loc"]),
            "msg": error["msg"],
            "input": error.get("input"),
        }
        if "ctx" in error:
            entry["ctx"] = {k: v if is_json(v) else str(v) for k, v in error["ctx"].items()}
        errors.append(entry)
    return errors


def is_json(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
