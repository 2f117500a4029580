"""A policy by name with its typed params: a discriminated union on ``name``, one member per
policy, validated once where a spec comes in (a request body, a stored row, a flag) and passed
on typed to the store, the engine and ``make_policy``.

The engine caps bound some params: pass ``{"limits": EngineLimits}`` as the validation context
to check them while parsing (a request), or ``params.over_caps(limits)`` on a spec already
parsed (a stored row, which must stay readable when the engine shrank).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from engine.config import EngineLimits
from policies.base import PolicyParams
from policies.continuous import ContinuousParams
from policies.dynamic import DynamicParams
from policies.hybrid import HybridParams
from policies.static import StaticParams


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    params: PolicyParams


class StaticSpec(_Spec):
    name: Literal["static"] = Field(description="Scheduling policy.")
    params: StaticParams = Field(default_factory=StaticParams, description="Its params.")


class DynamicSpec(_Spec):
    name: Literal["dynamic"] = Field(description="Scheduling policy.")
    params: DynamicParams = Field(default_factory=DynamicParams, description="Its params.")


class ContinuousSpec(_Spec):
    name: Literal["continuous"] = Field(description="Scheduling policy.")
    params: ContinuousParams = Field(default_factory=ContinuousParams, description="Its params.")


class HybridSpec(_Spec):
    name: Literal["hybrid"] = Field(description="Scheduling policy.")
    params: HybridParams = Field(default_factory=HybridParams, description="Its params.")


PolicySpec = Annotated[
    StaticSpec | DynamicSpec | ContinuousSpec | HybridSpec, Field(discriminator="name")
]
"""A policy spec: the member named by ``name``; its params only those given (a dump shows
just them), the rest following the policy's defaults."""

SPECS: dict[str, type[_Spec]] = {
    "static": StaticSpec,
    "dynamic": DynamicSpec,
    "continuous": ContinuousSpec,
    "hybrid": HybridSpec,
}
_ADAPTER: TypeAdapter[PolicySpec] = TypeAdapter(PolicySpec)
_NAMES = " or ".join(f"'{n}'" for n in SPECS).replace(" or ", ", ", len(SPECS) - 2)


def default_spec(name: str) -> PolicySpec:
    """The policy with every param at its default (ValidationError for an unknown name)."""
    return _ADAPTER.validate_python({"name": name})


def parse_spec(raw: Any, limits: EngineLimits | None = None) -> PolicySpec:
    """A spec from JSON-like data (a policy file, a stored row); with ``limits``, the capped
    params are checked against them. Raises pydantic's ValidationError, a bad or missing
    ``name`` at loc ``("name",)`` as the union's tag errors are reported (``named_tags``)."""
    context = {"limits": limits} if limits is not None else None
    try:
        return _ADAPTER.validate_python(raw, context=context)
    except ValidationError as exc:
        raise named_tags(exc) from None


def named_tags(exc: ValidationError) -> ValidationError:
    """``exc`` with the errors of a policy spec reported as a plain model with a ``name:
    PolicyName`` field reported them (the locs and messages the admin API has always answered
    with): a bad or missing tag on ``name`` (a literal or missing error), a member's errors
    without the member's tag in their ``loc``."""
    return ValidationError.from_exception_data(
        exc.title, [_named(error) for error in exc.errors(include_url=False)]
    )


def _named(error: ErrorDetails) -> InitErrorDetails:
    ctx = dict(error.get("ctx") or {})
    loc = error["loc"]
    kind, msg = error["type"], error["msg"]
    if ctx.get("discriminator") == "'name'" and kind in (
        "union_tag_invalid",
        "union_tag_not_found",
    ):
        loc = (*loc, "name")
        if kind == "union_tag_invalid":
            kind, msg, ctx = "literal_error", f"Input should be {_NAMES}", {"expected": _NAMES}
            return InitErrorDetails(
                type=PydanticCustomError(kind, msg, ctx), loc=loc, input=error["ctx"]["tag"]
            )
        kind, msg, ctx = "missing", "Field required", {}
    else:
        loc = tuple(
            part
            for i, part in enumerate(loc)
            if not (part in SPECS and loc[i + 1 : i + 2] in (("params",), ("name",)))
        )
    return InitErrorDetails(
        type=PydanticCustomError(kind, msg, ctx or None), loc=loc, input=error["input"]
    )


def check_caps(spec: PolicySpec, limits: EngineLimits) -> None:
    """Raise pydantic's ValidationError (``loc`` ``("params", field)``, the message a parse
    with the limits gives) when a param of an already parsed spec is above an engine cap."""
    over = spec.params.over_caps(limits)
    if over:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("value_error", "Value error, {error}", {"error": why}),
                loc=("params", field),
                input=getattr(spec.params, field),
            )
            for field, why in over.items()
        ]
        raise ValidationError.from_exception_data(type(spec).__name__, errors)
