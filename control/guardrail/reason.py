"""The reason a guardrail decision gives: the prediction quoted against the objectives and
the setting in force, and what changes. Pure (``control.guardrail.plan`` uses it)."""

from __future__ import annotations

from control.guardrail.schemas import Candidate, Objectives
from control.policy.schemas import PolicySettings


def _seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:.2f} s" if value >= 0.1 else f"{value:.3f} s"


def _value(value: object) -> str:
    if value is None:
        return "default"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def changes(before: PolicySettings, after: PolicySettings) -> list[str]:
    """``"knob old -> new"`` for each field that differs (params as written; ``default``
    where one is left to its default)."""
    found = []
    if before.policy.name != after.policy.name:
        found.append(f"policy {before.policy.name} -> {after.policy.name}")
    old, new = before.policy.params.model_dump(), after.policy.params.model_dump()
    for knob in dict.fromkeys([*old, *new]):
        if old.get(knob) != new.get(knob):
            found.append(f"{knob} {_value(old.get(knob))} -> {_value(new.get(knob))}")
    for knob in ("memory_reserve", "reclaim_interval_s"):
        if getattr(before, knob) != getattr(after, knob):
            found.append(
                f"{knob} {_value(getattr(before, knob))} -> {_value(getattr(after, knob))}"
            )
    return found


def explain(objectives: Objectives, current: Candidate, chosen: Candidate) -> str:
    """The prediction quoted: each objective (predicted, objective, now), the throughput of
    both and what changes, e.g. ``TTFT p99 predicted 0.41 s (objective 1.00 s) vs 3.20 s now;
    812 vs 790 output tok/s; max_num_batched_tokens 256 -> 1024``."""
    then, now = chosen.prediction, current.prediction
    parts = []
    for label, bound, field in (
        ("TTFT p99", objectives.ttft_p99_s, "ttft_p99_s"),
        ("TPOT p99", objectives.tpot_p99_s, "tpot_p99_s"),
    ):
        if bound is not None:
            parts.append(
                f"{label} predicted {_seconds(getattr(then, field))} "
                f"(objective {_seconds(bound)}) vs {_seconds(getattr(now, field))} now"
            )
    if objectives.goodput_min_rps is not None:
        rate = [
            f"{x:.2f}" if x is not None else "unknown" for x in (then.goodput_rps, now.goodput_rps)
        ]
        parts.append(
            f"goodput predicted {rate[0]} req/s (floor {objectives.goodput_min_rps:.2f}) "
            f"vs {rate[1]} now"
        )
    parts.append(f"{then.output_tokens_per_s:.0f} vs {now.output_tokens_per_s:.0f} output tok/s")
    parts.append(", ".join(changes(current.settings, chosen.settings)) or "no change")
    return "; ".join(parts)
