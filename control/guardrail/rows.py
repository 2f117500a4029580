"""The guardrail's rows: its stored config (``GuardrailSetting``), its decisions
(``GuardrailDecision``) as ``DecisionView``, and the checks of a config against the engine."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, col, select

from control.arrivals import ArrivalLog
from control.guardrail import plan
from control.guardrail.plan import Choice
from control.guardrail.schemas import (
    Candidate,
    DecisionView,
    GuardrailConfig,
    GuardrailUpdate,
    Objectives,
    ObservedFigures,
    Outcome,
)
from control.models import GuardrailDecision, GuardrailSetting, PolicyVersion, as_utc
from control.policy.schemas import SettingPrediction
from engine.config import EngineLimits
from policies.registry import POLICIES

ACTOR = "guardrail"
"""The actor of the policy versions the guardrail stores."""
CAPPED_BOUNDS = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_prefill_tokens": "max_num_batched_tokens",
}
"""Bounds whose max must stay under an engine cap: knob -> the ``EngineLimits`` field."""


@dataclass(frozen=True, slots=True)
class StoredConfig:
    """The config in force and the row it came from (revision 0: the defaults, never stored)."""

    config: GuardrailConfig
    revision: int = 0
    actor: str | None = None
    reason: str | None = None
    updated_at: datetime | None = None


def newest_config(session: Session) -> StoredConfig:
    row = session.exec(select(GuardrailSetting).order_by(col(GuardrailSetting.id).desc())).first()
    return StoredConfig(GuardrailConfig()) if row is None else stored(row)


def stored(row: GuardrailSetting) -> StoredConfig:
    assert row.id is not None
    return StoredConfig(
        config=GuardrailConfig.model_validate(row.config),
        revision=row.id,
        actor=row.actor,
        reason=row.reason,
        updated_at=as_utc(row.created_at),
    )


def setting_row(update: GuardrailUpdate, actor: str) -> GuardrailSetting:
    config = GuardrailConfig.model_validate(update.model_dump(exclude={"reason"}))
    return GuardrailSetting(
        actor=actor, reason=update.reason.strip(), config=config.model_dump(mode="json")
    )


# Any: pydantic-style error entries, JSON (as control/policy/checks.py's)
def cap_errors(update: GuardrailConfig, limits: EngineLimits) -> list[dict[str, Any]]:
    """Pydantic-style errors for bounds above the engine caps (``bounds.max_num_seqs.max``):
    the guardrail could never use them."""
    errors = []
    for knob, limit in CAPPED_BOUNDS.items():
        bound = getattr(update.bounds, knob)
        cap = getattr(limits, limit)
        if bound is not None and bound.max > cap:
            errors.append(
                {
                    "type": "less_than_equal",
                    "loc": ("bounds", knob, "max"),
                    "msg": f"Input should be less than or equal to {cap} (the engine's {limit})",
                    "input": bound.max,
                    "ctx": {"le": cap},
                }
            )
    return errors


def contradictions(update: GuardrailConfig) -> list[dict[str, Any]]:
    """Pydantic-style errors for bounds that say two things: a policy allowed twice
    (``bounds.policies``), or a bounded knob that no allowed policy has (``bounds.max_num_seqs``
    with only ``static`` allowed: the guardrail could never move it)."""
    allowed = update.bounds.policies
    errors: list[dict[str, Any]] = []
    if twice := sorted({name for name in allowed if allowed.count(name) > 1}):
        errors.append(
            {
                "type": "value_error",
                "loc": ("bounds", "policies"),
                "msg": f"Value error, policies allowed more than once: {', '.join(twice)}",
                "input": allowed,
            }
        )
    for knob in plan.PARAM_KNOBS:
        bound = getattr(update.bounds, knob)
        if bound is None or any(knob in POLICIES[n].params_model.model_fields for n in allowed):
            continue
        errors.append(
            {
                "type": "value_error",
                "loc": ("bounds", knob),
                "msg": f"Value error, no allowed policy ({', '.join(allowed)}) has {knob}: "
                "leave it null or allow a policy that has it",
                "input": bound.model_dump(),
            }
        )
    return errors


def last_change(session: Session) -> datetime | None:
    """When the guardrail last stored a policy version (the rate limit counts from it)."""
    row = session.exec(
        select(PolicyVersion)
        .where(PolicyVersion.actor == ACTOR)
        .order_by(col(PolicyVersion.version).desc())
    ).first()
    return None if row is None else as_utc(row.created_at)


def unfilled(session: Session) -> list[GuardrailDecision]:
    query = select(GuardrailDecision).where(col(GuardrailDecision.filled_at).is_(None))
    return list(session.exec(query.order_by(col(GuardrailDecision.id))).all())


def in_force_after(row: GuardrailDecision) -> SettingPrediction:
    """The prediction of the setting in force after the decision: the chosen one when it was
    applied, else the one that stayed (what ``observed_after`` is compared with)."""
    figures = row.predicted if row.outcome == "applied" else row.predicted_current
    return SettingPrediction.model_validate(figures)


def fill_after(
    session: Session, arrivals: ArrivalLog, objectives: Objectives, at: datetime, now: float
) -> None:
    """``observed_after`` and ``prediction_error`` of the decisions whose interval has passed
    by ``at``: the requests that finished in it, from the arrival log (``now`` is ``at`` on
    the engine clock: a wall time maps to it by the offset between the two clocks)."""
    offset = now - at.timestamp()
    for row in unfilled(session):
        start = as_utc(row.at)
        end = start + timedelta(seconds=row.interval_s)
        if end > at:
            continue
        finished = arrivals.finished(start.timestamp() + offset, end.timestamp() + offset)
        after = plan.observed_figures(finished, start, end, row.interval_s, objectives)
        row.observed_after = after.model_dump(mode="json")
        # Nothing finished in the interval: nothing to compare (a rate of 0 is no error).
        error = plan.prediction_error(after, in_force_after(row)) if finished else None
        row.prediction_error = error
        row.filled_at = at
        session.add(row)
    session.commit()


def decision_row(
    config: GuardrailConfig,
    at: datetime,
    outcome: Outcome,
    reason: str,
    judged: list[Candidate],
    choice: Choice,
    observed: ObservedFigures,
    correction: float,
    trace_requests: int,
) -> GuardrailDecision:
    """The row of a proposal; ``judged[0]`` is the setting in force."""
    return GuardrailDecision(
        at=at,
        mode=config.mode,
        outcome=outcome,
        reason=reason,
        current=judged[0].settings.model_dump(mode="json"),
        chosen=choice.candidate.settings.model_dump(mode="json"),
        predicted_current=judged[0].prediction.model_dump(mode="json"),
        predicted=choice.candidate.prediction.model_dump(mode="json"),
        candidates=[c.model_dump(mode="json") for c in judged],
        observed_before=observed.model_dump(mode="json"),
        correction=correction,
        trace_requests=trace_requests,
        interval_s=config.interval_s,
    )


def decisions(session: Session, limit: int) -> list[DecisionView]:
    rows = session.exec(
        select(GuardrailDecision).order_by(col(GuardrailDecision.id).desc()).limit(limit)
    ).all()
    return [view(row) for row in rows]


def view(row: GuardrailDecision) -> DecisionView:
    return DecisionView.model_validate(
        row.model_dump(exclude={"interval_s", "filled_at"}) | {"at": as_utc(row.at)}
    )
