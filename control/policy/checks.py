"""A request body that carries a policy spec, parsed once against the live engine, and
pydantic's errors in the JSON-safe, ``loc``-prefixed form the admin API answers with."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from engine.config import EngineLimits
from policies.spec import named_tags

Body = TypeVar("Body", bound=BaseModel)


class SettingsInvalid(ValueError):
    """Pydantic-style errors (``loc`` relative to the request body) naming every bad field."""

    # Any: pydantic's error entries, JSON (their input is whatever the client sent)
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def parse_body(model: type[Body], raw: Any, limits: EngineLimits) -> Body:  # Any: a JSON body
    """``raw`` as ``model``, the policy params checked against the engine caps in the same
    pass (one SettingsInvalid names every failing field); the one validation of the body."""
    try:
        return model.model_validate(raw, context={"limits": limits})
    except ValidationError as exc:
        raise SettingsInvalid(pydantic_errors(named_tags(exc))) from None


def pydantic_errors(
    exc: ValidationError, prefix: tuple[str | int, ...] = ()
) -> list[dict[str, Any]]:  # Any: as SettingsInvalid's
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


def is_json(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
