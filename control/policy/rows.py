"""Policy versions as rows and as settings: the seed row, a stored row's settings with the
start-up overrides on top, its public view and state, and the diff between two settings."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from control.models import PolicyVersion, as_utc, utcnow
from control.policy.schemas import FieldChange, PolicySettings, PolicyVersionPublic, VersionStatus
from engine.config import config_default
from policies.queue import FcfsQueue
from policies.spec import default_spec, parse_spec

DEFAULT_SETTINGS = PolicySettings(
    policy=default_spec(config_default("policy")),
    memory_reserve=config_default("memory_reserve"),
    reclaim_interval_s=5.0,
)
"""Version 1's settings: the policy and reserve are EngineConfig's defaults."""
SEED_ACTOR = "servedeck"


def seed(session: Session) -> PolicyVersion:
    """Version 1 from the defaults at first start; otherwise the newest version."""
    row = newest_row(session)
    if row is None:
        row = new_row(1, DEFAULT_SETTINGS, [], SEED_ACTOR, "seeded from the defaults", None)
        session.add(row)
        session.commit()
        session.refresh(row)
    return row


def with_overrides(row: PolicyVersion, overrides: dict[str, object]) -> PolicySettings:
    """A stored version's settings with start-up overrides on top. An overridden policy name
    that differs from the stored one comes with its default params."""
    settings = settings_of(row)
    name = overrides.get("policy.name")
    if isinstance(name, str) and name != settings.policy.name:  # a PolicyName (Settings)
        settings.policy = default_spec(name)
    for field in ("memory_reserve", "reclaim_interval_s"):
        if field in overrides:
            setattr(settings, field, overrides[field])
    return settings


def settings_of(row: PolicyVersion) -> PolicySettings:
    """A stored version's settings, parsed once (not checked against the engine caps: a row
    stays readable when the engine shrank; the caps are checked where it is put into force).
    A row stored before the queue axis existed reads as ``fcfs``."""
    return PolicySettings(
        policy=parse_spec({"name": row.policy_name, "params": row.policy_params}),
        queue=row.queue or FcfsQueue(),
        memory_reserve=row.memory_reserve,
        reclaim_interval_s=row.reclaim_interval_s,
    )


def status_of(row: PolicyVersion) -> VersionStatus:
    at = as_utc(row.state_at) if row.state_at is not None else None
    return VersionStatus(state=row.state, state_reason=row.state_reason, state_at=at)


def public(row: PolicyVersion) -> PolicyVersionPublic:
    settings = settings_of(row)
    return PolicyVersionPublic(
        version=row.version,
        settings=settings,
        actor=row.actor,
        reason=row.reason,
        before=PolicySettings.model_validate(row.before) if row.before else None,
        after=settings,
        created_at=as_utc(row.created_at),
        rollback_of=row.rollback_of,
        status=status_of(row),
    )


# Any: a setting's value by its dotted name, JSON (a policy's params are its own)
def flatten(settings: PolicySettings) -> dict[str, Any]:
    flat: dict[str, Any] = {"policy.name": settings.policy.name}
    params = settings.policy.params.model_dump(mode="json")
    for key in sorted(params):
        flat[f"policy.params.{key}"] = params[key]
    flat["queue.name"] = settings.queue.name
    flat["memory_reserve"] = settings.memory_reserve
    flat["reclaim_interval_s"] = settings.reclaim_interval_s
    return flat


def diff(before: PolicySettings, after: PolicySettings) -> list[FieldChange]:
    old, new = flatten(before), flatten(after)
    params = sorted({f for f in (*old, *new) if f.startswith("policy.params.")})
    fields = ["policy.name", *params, "queue.name", "memory_reserve", "reclaim_interval_s"]
    return [
        FieldChange(field=f, before=old.get(f), after=new.get(f))
        for f in fields
        if old.get(f) != new.get(f)
    ]


def newest_row(session: Session) -> PolicyVersion | None:
    return session.exec(
        select(PolicyVersion).order_by(col(PolicyVersion.version).desc()).limit(1)
    ).first()


def new_row(
    version: int,
    settings: PolicySettings,
    explicit: list[str],
    actor: str,
    reason: str,
    before: PolicySettings | None,
    rollback_of: int | None = None,
) -> PolicyVersion:
    return PolicyVersion(
        version=version,
        policy_name=settings.policy.name,
        policy_params=settings.policy.params.model_dump(mode="json"),
        queue=settings.queue.model_dump(mode="json"),
        memory_reserve=settings.memory_reserve,
        reclaim_interval_s=settings.reclaim_interval_s,
        explicit=explicit,
        actor=actor,
        reason=reason,
        before=before.model_dump(mode="json") if before is not None else None,
        created_at=utcnow(),
        rollback_of=rollback_of,
    )
