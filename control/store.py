"""The policy store: versioned settings in SQLite, what is in force, and where each value
came from.

Every change is a new ``PolicyVersion`` row; the newest row is the desired version and is
re-applied at start-up. Each version is stored ``pending`` and committed before the engine is
asked to take it, then marked ``applied`` or ``failed`` (with the reason); a version the engine
has not taken within the timeout stays ``pending`` and ``reconcile`` retries the newest one
until it is in force, so a stored change is never answered as a failure.

Start-up flags (``--policy`` and friends) are *overrides*: they win for this process without
being stored, until the next change stores the settings in force (overrides included) as a new
version. Writes may carry the version they were based on and fail with a conflict when it moved
on; a dry run validates and diffs without storing.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Protocol

from pydantic import ValidationError
from sqlmodel import Session, col, func, select, update

from control.metrics import ControlMetrics
from control.models import PolicyVersion, as_utc, utcnow
from control.schemas import (
    FieldChange,
    PolicyHistory,
    PolicySettings,
    PolicyUpdate,
    PolicyUpdateResult,
    PolicyVersionPublic,
    PolicyView,
    Source,
    VersionState,
    VersionStatus,
)
from engine.config import EngineLimits
from policies.base import PolicySpec
from policies.registry import POLICIES, params_schemas, validate_params

DEFAULT_SETTINGS = PolicySettings(
    policy=PolicySpec(name="continuous"), memory_reserve=0.10, reclaim_interval_s=5.0
)
TOP_LEVEL = ("policy.name", "memory_reserve", "reclaim_interval_s")
SEED_ACTOR = "servedeck"

log = logging.getLogger(__name__)


class Apply(Protocol):
    def __call__(
        self, settings: PolicySettings, version: int, timeout: float | None = None
    ) -> None:
        """Put settings into force (engine, scheduler, metrics). Raises ``TimeoutError`` when
        the engine has not taken them within ``timeout`` (the version stays pending and is
        retried), any other exception when it refused them (the version failed)."""


class SettingsInvalid(ValueError):
    """Pydantic-style errors (``loc`` relative to the request body) naming every bad field."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


class VersionConflict(RuntimeError):
    pass


class VersionNotFound(LookupError):
    pass


class PolicyStore:
    def __init__(
        self,
        limits: EngineLimits,
        apply: Apply,
        metrics: ControlMetrics,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        """``overrides`` maps ``policy.name``, ``memory_reserve`` or ``reclaim_interval_s``
        to a value forced by a start-up flag."""
        unknown = set(overrides or {}) - set(TOP_LEVEL)
        if unknown:
            raise ValueError(f"cannot override {sorted(unknown)}")
        self.limits = limits
        self._apply = apply
        self._metrics = metrics
        self._overrides = dict(overrides or {})
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------

    def newest(self, session: Session) -> PolicyVersion:
        row = _newest(session)
        if row is None:
            raise VersionNotFound("no policy version is stored yet")
        return row

    def effective(self, row: PolicyVersion) -> PolicySettings:
        return with_overrides(row, self._overrides)

    def view(self, session: Session) -> PolicyView:
        row = self.newest(session)
        settings = self.effective(row)
        return PolicyView(
            version=row.version,
            settings=settings,
            effective_params=self.effective_params(settings.policy),
            sources=self._sources(row, settings),
            actor=row.actor,
            reason=row.reason,
            created_at=as_utc(row.created_at),
            status=status_of(row),
        )

    def effective_params(self, spec: PolicySpec) -> dict[str, Any]:
        """Every param in force; a ``None`` default means the engine cap, shown as its value."""
        try:
            params = validate_params(spec, self.limits).model_dump()
        except ValidationError:  # stored params that no longer fit: the engine took defaults
            params = validate_params(PolicySpec(name=spec.name), self.limits).model_dump()
        caps = POLICIES[spec.name].params_model.caps
        for field, limit in caps.items():
            if params.get(field) is None:
                params[field] = getattr(self.limits, limit)
        return params

    def _sources(self, row: PolicyVersion, settings: PolicySettings) -> dict[str, Source]:
        def top(field: str) -> Source:
            if field in self._overrides:
                return "override"
            return "stored" if field in row.explicit else "default"

        sources: dict[str, Source] = {"policy.name": top("policy.name")}
        for field in POLICIES[settings.policy.name].params_model.model_fields:
            given = field in settings.policy.params
            sources[f"policy.params.{field}"] = "stored" if given else "default"
        sources["memory_reserve"] = top("memory_reserve")
        sources["reclaim_interval_s"] = top("reclaim_interval_s")
        return sources

    def history(self, session: Session, offset: int, limit: int) -> PolicyHistory:
        total = session.exec(select(func.count()).select_from(PolicyVersion)).one()
        rows = session.exec(
            select(PolicyVersion)
            .order_by(col(PolicyVersion.version).desc())
            .offset(offset)
            .limit(limit)
        ).all()
        return PolicyHistory(
            items=[public(row) for row in rows], total=total, offset=offset, limit=limit
        )

    # -- validation ------------------------------------------------------------------------

    def validate(self, raw: Any) -> PolicyUpdate:
        """Validate a PUT body against the live engine; raise SettingsInvalid naming every
        failing field, including policy params checked against the engine caps."""
        errors: list[dict[str, Any]] = []
        update: PolicyUpdate | None = None
        try:
            update = PolicyUpdate.model_validate(raw)
        except ValidationError as exc:
            errors.extend(_errors(exc))
        spec = update.policy if update is not None else _spec_or_none(raw)
        if spec is not None:
            typed = _param_type_errors(spec)
            mistyped = {e["loc"] for e in typed}
            errors.extend(typed)
            errors.extend(e for e in self._params_errors(spec) if e["loc"] not in mistyped)
        if errors or update is None:
            self._metrics.count_policy_update("invalid")
            raise SettingsInvalid(errors)
        return update

    def _normalized(self, spec: PolicySpec) -> PolicySpec:
        """The spec with its given params as validated (``16.0`` stored as ``16``)."""
        try:
            params = validate_params(spec, self.limits)
        except ValidationError as exc:
            self._metrics.count_policy_update("invalid")
            raise SettingsInvalid(_errors(exc, ("policy", "params"))) from None
        return PolicySpec(name=spec.name, params=params.model_dump(exclude_unset=True))

    def _params_errors(self, spec: PolicySpec, prefix: tuple[Any, ...] = ()) -> list[dict]:
        try:
            validate_params(spec, self.limits)
        except ValidationError as exc:
            return _errors(exc, (*prefix, "policy", "params"))
        return []

    # -- writing ---------------------------------------------------------------------------

    def update(
        self,
        session: Session,
        update: PolicyUpdate,
        actor: str,
        if_match: int | None = None,
        dry_run: bool = False,
    ) -> PolicyUpdateResult:
        policy = self._normalized(update.policy) if update.policy is not None else None
        with self._lock:
            row = self._current(session, if_match)
            before = self.effective(row)
            after = PolicySettings(
                policy=policy or before.policy,
                memory_reserve=_given(update.memory_reserve, before.memory_reserve),
                reclaim_interval_s=_given(update.reclaim_interval_s, before.reclaim_interval_s),
            )
            given = {
                "policy.name": update.policy,
                "memory_reserve": update.memory_reserve,
                "reclaim_interval_s": update.reclaim_interval_s,
            }
            explicit = set(row.explicit) | set(self._overrides)
            explicit |= {field for field, value in given.items() if value is not None}
            if dry_run:
                self._metrics.count_policy_update("dry_run")
                return PolicyUpdateResult(
                    dry_run=True,
                    applied=False,
                    version=row.version,
                    diff=diff(before, after),
                    settings=after,
                    status=None,
                )
            return self._store(session, row, before, after, explicit, actor, update.reason, None)

    def rollback(
        self,
        session: Session,
        version: int,
        actor: str,
        reason: str | None = None,
        if_match: int | None = None,
    ) -> PolicyUpdateResult:
        with self._lock:
            row = self._current(session, if_match)
            target = session.get(PolicyVersion, version)
            if target is None:
                self._metrics.count_policy_update("not_found")
                raise VersionNotFound(
                    f"policy version {version} does not exist (newest is {row.version})"
                )
            after = settings_of(target)
            if errors := self._params_errors(after.policy, ("version", version)):
                self._metrics.count_policy_update("invalid")
                raise SettingsInvalid(errors)
            reason = reason or f"rollback to version {version}"
            before = self.effective(row)
            explicit = set(target.explicit)
            return self._store(session, row, before, after, explicit, actor, reason, version)

    def _current(self, session: Session, if_match: int | None) -> PolicyVersion:
        row = self.newest(session)
        if if_match is not None and if_match != row.version:
            self._metrics.count_policy_update("conflict")
            raise VersionConflict(f"version is {row.version}, not {if_match}: reload and retry")
        return row

    def _store(
        self,
        session: Session,
        row: PolicyVersion,
        before: PolicySettings,
        after: PolicySettings,
        explicit: set[str],
        actor: str,
        reason: str,
        rollback_of: int | None,
    ) -> PolicyUpdateResult:
        new = _row(row.version + 1, after, sorted(explicit), actor, reason, before, rollback_of)
        session.add(new)
        session.commit()  # stored (pending) before the engine is asked: the change is kept
        self._overrides.clear()
        status = self._put_in_force(session, new, after)
        self._metrics.count_policy_update(status.state)
        return PolicyUpdateResult(
            dry_run=False,
            applied=status.state == "applied",
            version=new.version,
            diff=diff(before, after),
            settings=after,
            status=status,
        )

    # -- putting versions into force -------------------------------------------------------

    def _put_in_force(
        self,
        session: Session,
        row: PolicyVersion,
        settings: PolicySettings,
        timeout: float | None = None,
    ) -> VersionStatus:
        try:
            self._apply(settings, row.version, timeout)
        except TimeoutError:
            reason = "the engine has not taken it yet; retried until it is in force"
            return self.mark(session, row.version, "pending", reason)
        except Exception as exc:
            log.exception("policy version %d could not be put into force", row.version)
            return self.mark(session, row.version, "failed", f"{type(exc).__name__}: {exc}")
        return self.mark(session, row.version, "applied")

    def reconcile(self, session: Session, timeout: float | None = None) -> VersionStatus | None:
        """Retry the newest version while it is pending (a maintenance job calls this, each
        attempt bounded by ``timeout``); its status, or None when there was nothing to do."""
        with self._lock:
            row = _newest(session)
            if row is None or row.state != "pending":
                return None
            status = self._put_in_force(session, row, self.effective(row), timeout)
        if status.state != "pending":
            log.info("policy version %d %s on retry", row.version, status.state)
        return status

    def mark(
        self, session: Session, version: int, state: VersionState, reason: str | None = None
    ) -> VersionStatus:
        """Record a version's state; once one is applied, older versions still pending were
        superseded before they were in force and are marked failed."""
        now = utcnow()
        session.exec(
            update(PolicyVersion)
            .where(col(PolicyVersion.version) == version)
            .values(state=state, state_reason=reason, state_at=now)
        )
        if state == "applied":
            session.exec(
                update(PolicyVersion)
                .where(col(PolicyVersion.version) < version, PolicyVersion.state == "pending")
                .values(
                    state="failed",
                    state_reason=f"superseded by version {version} before it was in force",
                    state_at=now,
                )
            )
        session.commit()
        session.expire_all()
        return VersionStatus(state=state, state_reason=reason, state_at=now)


# -- helpers -----------------------------------------------------------------------------------


def seed(session: Session) -> PolicyVersion:
    """Version 1 from the defaults at first start; otherwise the newest version."""
    row = _newest(session)
    if row is None:
        row = _row(1, DEFAULT_SETTINGS, [], SEED_ACTOR, "seeded from the defaults", None)
        session.add(row)
        session.commit()
        session.refresh(row)
    return row


def with_overrides(row: PolicyVersion, overrides: dict[str, Any]) -> PolicySettings:
    """A stored version's settings with start-up overrides on top. An overridden policy name
    that differs from the stored one comes with its default params."""
    settings = settings_of(row)
    name = overrides.get("policy.name")
    if name is not None and name != settings.policy.name:
        settings.policy = PolicySpec(name=name)
    for field in ("memory_reserve", "reclaim_interval_s"):
        if field in overrides:
            setattr(settings, field, overrides[field])
    return settings


def settings_of(row: PolicyVersion) -> PolicySettings:
    return PolicySettings(
        policy=PolicySpec(name=row.policy_name, params=dict(row.policy_params)),  # type: ignore[arg-type]
        memory_reserve=row.memory_reserve,
        reclaim_interval_s=row.reclaim_interval_s,
    )


def status_of(row: PolicyVersion) -> VersionStatus:
    at = as_utc(row.state_at) if row.state_at is not None else None
    return VersionStatus(state=row.state, state_reason=row.state_reason, state_at=at)  # type: ignore[arg-type]


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


def flatten(settings: PolicySettings) -> dict[str, Any]:
    flat: dict[str, Any] = {"policy.name": settings.policy.name}
    for key in sorted(settings.policy.params):
        flat[f"policy.params.{key}"] = settings.policy.params[key]
    flat["memory_reserve"] = settings.memory_reserve
    flat["reclaim_interval_s"] = settings.reclaim_interval_s
    return flat


def diff(before: PolicySettings, after: PolicySettings) -> list[FieldChange]:
    old, new = flatten(before), flatten(after)
    params = sorted({f for f in (*old, *new) if f.startswith("policy.params.")})
    fields = ["policy.name", *params, "memory_reserve", "reclaim_interval_s"]
    return [
        FieldChange(field=f, before=old.get(f), after=new.get(f))
        for f in fields
        if old.get(f) != new.get(f)
    ]


def _newest(session: Session) -> PolicyVersion | None:
    return session.exec(
        select(PolicyVersion).order_by(col(PolicyVersion.version).desc()).limit(1)
    ).first()


def _row(
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
        policy_params=dict(settings.policy.params),
        memory_reserve=settings.memory_reserve,
        reclaim_interval_s=settings.reclaim_interval_s,
        explicit=explicit,
        actor=actor,
        reason=reason,
        before=before.model_dump(mode="json") if before is not None else None,
        created_at=utcnow(),
        rollback_of=rollback_of,
    )


def _given(value: float | None, current: float) -> float:
    return current if value is None else value


def _spec_or_none(raw: Any) -> PolicySpec | None:
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


def _param_type_errors(spec: PolicySpec) -> list[dict[str, Any]]:
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
                    "input": value if _is_json(value) else repr(value),
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


def _errors(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
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
            entry["ctx"] = {k: v if _is_json(v) else str(v) for k, v in error["ctx"].items()}
        errors.append(entry)
    return errors


def _is_json(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
