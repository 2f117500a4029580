"""Build a policy from a PolicySpec; the one place that knows every policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config import EngineLimits
from engine.kv_cache import BlockManager
from policies.base import PolicyParams, PolicySpec, SchedulingPolicy
from policies.continuous import ContinuousPolicy
from policies.dynamic import DynamicPolicy
from policies.hybrid import HybridPolicy
from policies.static import StaticPolicy

POLICIES: dict[str, type[SchedulingPolicy]] = {
    cls.name: cls for cls in (StaticPolicy, DynamicPolicy, ContinuousPolicy, HybridPolicy)
}


def as_spec(spec: PolicySpec | str | dict[str, Any]) -> PolicySpec:
    if isinstance(spec, PolicySpec):
        return spec
    if isinstance(spec, str):
        return PolicySpec(name=spec)  # type: ignore[arg-type]
    return PolicySpec.model_validate(spec)


def validate_params(spec: PolicySpec, limits: EngineLimits | None = None) -> PolicyParams:
    """Raise pydantic's ValidationError naming each bad field and its bound."""
    context = {"limits": limits} if limits is not None else None
    return POLICIES[spec.name].params_model.model_validate(spec.params, context=context)


def make_policy(
    spec: PolicySpec | str | dict[str, Any],
    limits: EngineLimits,
    blocks: BlockManager,
    clock: Callable[[], float],
) -> SchedulingPolicy:
    """``clock`` is the engine's: policies read time (aging) from it, never the wall clock."""
    spec = as_spec(spec)
    params = validate_params(spec, limits)
    return POLICIES[spec.name](params, limits, blocks, clock)


def params_schemas() -> dict[str, dict[str, Any]]:
    """JSON schema of every policy's params (drives REST validation docs and the editor)."""
    return {name: cls.params_model.model_json_schema() for name, cls in POLICIES.items()}
