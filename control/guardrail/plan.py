"""The guardrail's planner: pure functions, no I/O and no clock reads.

Given the setting in force and the operator's bounds it lists the settings worth simulating
(``candidates``); given their predictions it picks the one that meets the objectives with the
most throughput (``choose``), with hysteresis so a change must pay for itself. It also turns
finished requests into observed figures and compares them with what was predicted
(``observed_figures``, ``prediction_error``); the cost model's correction is the engine's
own steps' (``sim.correction``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from control.guardrail.observed import observed_figures, prediction_error, within
from control.guardrail.reason import changes, explain
from control.guardrail.schemas import Candidate, GuardrailConfig, Objectives
from control.policy.schemas import PolicySettings, SettingPrediction
from engine.config import EngineLimits
from policies.registry import POLICIES
from policies.spec import parse_spec

__all__ = [
    "Choice",
    "assess",
    "candidates",
    "changes",
    "choose",
    "explain",
    "margin",
    "meets",
    "observed_figures",
    "prediction_error",
    "within",
]

PARAM_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_prefill_tokens",
    "single_request_below",
    "max_wait_s",
)
"""The policy params the guardrail may move (where the policy has them and bounds are set)."""
NO_MARGIN = -1.0
"""The margin of a prediction with no figure to compare (as far off as a figure twice the
objective): never preferred to one that has figures."""


class Figures(Protocol):
    """What ``SettingPrediction`` and ``ObservedFigures`` both have."""

    ttft_p99_s: float | None
    tpot_p99_s: float | None
    goodput_rps: float | None


@dataclass(frozen=True, slots=True)
class Choice:
    candidate: Candidate
    reason: str


# -- candidates ------------------------------------------------------------------------------


def _bound(config: GuardrailConfig, knob: str) -> tuple[float, float] | None:
    found = getattr(config.bounds, knob)
    return None if found is None else (found.min, found.max)


def _range(
    name: str, knob: str, config: GuardrailConfig, limits: EngineLimits
) -> tuple[float, float]:
    """The knob's bounds for policy ``name``, its max lowered to the engine cap if it has one
    (a range wholly above the cap is left as it is: nothing in it is valid)."""
    bound = _bound(config, knob)
    if bound is None:  # the candidates come from the knobs that have bounds: never here
        raise ValueError(f"the guardrail has no bounds for {knob}")
    low, high = bound
    cap_name = POLICIES[name].params_model.caps.get(knob)
    if cap_name is not None:
        high = max(low, min(high, getattr(limits, cap_name)))
    return low, high


def _value(settings: PolicySettings, knob: str, limits: EngineLimits) -> float:
    """A knob's value in effect: a missing param is its default, ``null`` the engine cap it
    stands for, or (``max_wait_s``) off, which counts as infinitely long."""
    if knob == "memory_reserve":
        return settings.memory_reserve
    model = POLICIES[settings.policy.name].params_model
    value = getattr(settings.policy.params, knob)
    if value is None and knob in model.caps:
        value = getattr(limits, model.caps[knob])
    return math.inf if value is None else value


def _points(low: float, high: float, integer: bool) -> list[float]:
    """The bound's min, geometric midpoint (arithmetic from zero) and max."""
    middle = math.sqrt(low * high) if low > 0 else (low + high) / 2
    points = [low, round(middle) if integer else round(middle, 4), high]
    return list(dict.fromkeys(points))


# Any: a policy's params by name, JSON (each policy's own)
def _effective(settings: PolicySettings, limits: EngineLimits) -> dict[str, Any] | None:
    params = settings.policy.params
    return None if params.over_caps(limits) else params.effective(limits)


def _key(settings: PolicySettings, params: dict[str, Any]) -> tuple[object, ...]:
    name = settings.policy.name
    return (
        name,
        tuple(sorted(params.items())),
        settings.memory_reserve,
        settings.reclaim_interval_s,
    )


def _within(settings: PolicySettings, params: dict[str, Any], config: GuardrailConfig) -> bool:
    for knob in (*PARAM_KNOBS, "memory_reserve"):
        bound = _bound(config, knob)
        if bound is None:
            continue
        value = settings.memory_reserve if knob == "memory_reserve" else params.get(knob, ...)
        if value is ...:  # the policy has no such knob
            continue
        if value is None or not bound[0] <= value <= bound[1]:
            return False
    return settings.policy.name in config.bounds.policies


def _with(settings: PolicySettings, knob: str, value: float) -> PolicySettings:
    if knob == "memory_reserve":
        return settings.model_copy(update={"memory_reserve": value})
    params = {**settings.policy.params.model_dump(), knob: value}
    try:
        policy = parse_spec({"name": settings.policy.name, "params": params})
    except ValidationError:  # outside the param's own bounds: no such candidate
        return settings
    return settings.model_copy(update={"policy": policy})


def _knobs(name: str, config: GuardrailConfig) -> list[str]:
    fields = POLICIES[name].params_model.model_fields
    knobs = [k for k in PARAM_KNOBS if k in fields] + ["memory_reserve"]
    return [k for k in knobs if _bound(config, k) is not None]


def _moved_in(
    current: PolicySettings, name: str, config: GuardrailConfig, limits: EngineLimits
) -> PolicySettings:
    """``current`` as policy ``name``: the params that policy shares with it carried over
    (one above its engine cap left to the cap), each bounded knob clamped into its range."""
    model = POLICIES[name].params_model
    params = {
        k: v
        for k, v in current.policy.params.model_dump().items()
        if k in model.model_fields
        and not (k in model.caps and v is not None and v > getattr(limits, model.caps[k]))
    }
    settings = current.model_copy(update={"policy": parse_spec({"name": name, "params": params})})
    for knob in _knobs(name, config):
        low, high = _range(name, knob, config, limits)
        value = _value(settings, knob, limits)
        if not low <= value <= high:
            settings = _with(settings, knob, type(low)(min(max(value, low), high)))
    return settings


def candidates(
    current: PolicySettings, config: GuardrailConfig, limits: EngineLimits
) -> list[PolicySettings]:
    """``current`` first, then settings inside the bounds worth simulating: for each allowed
    policy the current setting moved into the bounds, then one knob at a time at its bound's
    min, midpoint and max. Every one valid under the engine caps, none twice in effect, at
    most ``config.max_candidates`` in all (the moved-in settings before the variations, the
    variations of the policies taken in turns)."""
    names = list(dict.fromkeys(config.bounds.policies))
    if current.policy.name in names:  # its own policy first
        names.remove(current.policy.name)
        names.insert(0, current.policy.name)
    bases = [_moved_in(current, name, config, limits) for name in names]
    variations: list[list[PolicySettings]] = []
    for base in bases:
        own: list[PolicySettings] = []
        for knob in _knobs(base.policy.name, config):
            low, high = _range(base.policy.name, knob, config, limits)
            integer = knob not in ("max_wait_s", "memory_reserve")
            own += [_with(base, knob, value) for value in _points(low, high, integer)]
        variations.append(own)
    turns = [s for row in _interleave(variations) for s in row]
    chosen = [current]
    seen = {_key(current, _effective(current, limits) or current.policy.params.model_dump())}
    for settings in [*bases, *turns]:
        if len(chosen) >= config.max_candidates:
            break
        params = _effective(settings, limits)
        if params is None or not _within(settings, params, config):
            continue
        key = _key(settings, params)
        if key not in seen:
            seen.add(key)
            chosen.append(settings)
    return chosen


def _interleave(rows: list[list[PolicySettings]]) -> list[list[PolicySettings]]:
    longest = max((len(r) for r in rows), default=0)
    return [[r[i] for r in rows if i < len(r)] for i in range(longest)]


# -- judging predictions ---------------------------------------------------------------------


def margin(figures: Figures, objectives: Objectives) -> float | None:
    """Min over the set objectives of how far inside it the figure is, as a fraction:
    ``(objective - figure) / objective`` for the latencies, ``(goodput - floor) / floor`` for
    the goodput floor. Negative: missed. None when no objective has a figure."""
    terms = []
    for bound, figure in (
        (objectives.ttft_p99_s, figures.ttft_p99_s),
        (objectives.tpot_p99_s, figures.tpot_p99_s),
    ):
        if bound is not None and figure is not None:
            terms.append((bound - figure) / bound)
    if objectives.goodput_min_rps is not None and figures.goodput_rps is not None:
        floor = objectives.goodput_min_rps
        terms.append((figures.goodput_rps - floor) / floor)
    return min(terms) if terms else None


def meets(figures: Figures, objectives: Objectives) -> bool:
    found = margin(figures, objectives)
    return found is not None and found >= 0


def assess(
    settings: PolicySettings, prediction: SettingPrediction, objectives: Objectives
) -> Candidate:
    """A setting with its prediction judged against the objectives (no figure: ``NO_MARGIN``)."""
    found = margin(prediction, objectives)
    return Candidate(
        settings=settings,
        prediction=prediction,
        meets=found is not None and found >= 0,
        margin=NO_MARGIN if found is None else found,
    )


def _better(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` ranks above ``b``: meeting first; among those that meet, throughput
    then margin; among those that miss, margin then throughput."""
    if a.meets != b.meets:
        return a.meets
    tput_a, tput_b = a.prediction.output_tokens_per_s, b.prediction.output_tokens_per_s
    if a.meets:
        return (tput_a, a.margin) > (tput_b, b.margin)
    return (a.margin, tput_a) > (b.margin, tput_b)


def _beats(best: Candidate, current: Candidate, hysteresis: float) -> bool:
    if best.meets and not current.meets:
        return True
    if current.meets and not best.meets:
        return False
    if best.meets:  # both meet: by throughput, as a fraction of the current one's
        before = current.prediction.output_tokens_per_s
        return best.prediction.output_tokens_per_s > before * (1 + hysteresis)
    return best.margin - current.margin > hysteresis  # both miss: by margin


def choose(config: GuardrailConfig, current: Candidate, others: list[Candidate]) -> Choice | None:
    """The best of ``others`` (meets every objective with the most throughput, ties by the
    larger margin; when none meets, the largest margin), or None when it is the current
    setting or does not beat it by ``config.hysteresis``: a throughput fraction when both
    meet, a margin difference when both miss; one that meets beats a current that misses."""
    best: Candidate | None = None
    for candidate in others:
        if candidate.settings == current.settings:
            continue
        if best is None or _better(candidate, best):
            best = candidate
    if best is None or not _beats(best, current, config.hysteresis):
        return None
    return Choice(best, explain(config.objectives, current, best))
