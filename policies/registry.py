"""Build a policy from a PolicySpec; the one place that knows every policy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.config import EngineLimits
from engine.kv_cache import BlockManager
from policies.base import SchedulingPolicy
from policies.continuous import ContinuousPolicy
from policies.discipline import QueueDiscipline
from policies.dynamic import DynamicPolicy
from policies.hybrid import HybridPolicy
from policies.spec import PolicySpec, check_caps, default_spec, parse_spec
from policies.static import StaticPolicy

POLICIES: dict[str, type[SchedulingPolicy]] = {
    cls.name: cls for cls in (StaticPolicy, DynamicPolicy, ContinuousPolicy, HybridPolicy)
}


def as_spec(spec: PolicySpec | str | Mapping[str, Any]) -> PolicySpec:
    """A typed spec as it is; a policy's name (an engine flag) with its default params; JSON-like
    data (an in-process caller's ``{"name": ..., "params": ...}``) parsed once here."""
    if isinstance(spec, str):
        return default_spec(spec)
    if isinstance(spec, Mapping):
        return parse_spec(spec)
    return spec


def make_policy(
    spec: PolicySpec,
    limits: EngineLimits,
    blocks: BlockManager,
    clock: Callable[[], float],
    discipline: QueueDiscipline | None = None,
) -> SchedulingPolicy:
    """``spec`` is validated where it came in (its params typed, the engine caps checked
    there); ``clock`` is the engine's: policies read time (aging) from it, never the wall
    clock; ``discipline`` the queue's order (None: first come, first served).
    Raises pydantic's ValidationError for params above this engine's caps."""
    check_caps(spec, limits)
    return POLICIES[spec.name](spec.params, limits, blocks, clock, discipline)


def params_schemas() -> dict[str, dict[str, Any]]:
    """JSON schema of every policy's params (drives REST validation docs and the editor)."""
    return {name: cls.params_model.model_json_schema() for name, cls in POLICIES.items()}
