"""The policy store: versioned settings in SQLite, what is in force, and where each value
came from.

Every change is a new ``PolicyVersion`` row; the newest row is the desired version and is
re-applied at start-up. Each version is stored ``pending`` and committed before the engine is
asked to take it, then marked ``applied`` or ``failed`` (with the reason); a version the engine
has not taken within the timeout stays ``pending`` and ``reconcile`` retries the newest one
until it is in force, so a stored change is never answered as a failure. A write the database
refuses (a full disk, a read-only or locked file) raises ``StoreUnavailable``: before the version
is stored nothing changes in the engine; after it, the answer says it is stored and ``pending``
(its state could not be written) and the reconcile job records its state once it can.

Start-up flags (``--policy`` and friends) are *overrides*: they win for this process without
being stored, until the next change stores the settings in force (overrides included) as a new
version. Writes may carry the version they were based on and fail with a conflict when it moved
on; a dry run validates and diffs without storing.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, func, select, update

from control.core.db import unavailable
from control.metrics import ControlMetrics
from control.models import PolicyVersion, as_utc, utcnow
from control.policy.checks import SettingsInvalid, parse_body, pydantic_errors
from control.policy.rows import (
    diff,
    new_row,
    newest_row,
    public,
    settings_of,
    status_of,
    with_overrides,
)
from control.policy.schemas import (
    PolicyHistory,
    PolicySettings,
    PolicyUpdate,
    PolicyUpdateResult,
    PolicyView,
    Source,
    VersionState,
    VersionStatus,
)
from engine.config import EngineLimits
from policies.spec import PolicySpec, check_caps, default_spec

__all__ = [
    "Apply",
    "PolicyStore",
    "SettingsInvalid",
    "StoreUnavailable",
    "VersionConflict",
    "VersionNotFound",
]

TOP_LEVEL = ("policy.name", "memory_reserve", "reclaim_interval_s")
"""What a start-up flag may override (the queue has no flag)."""

log = logging.getLogger(__name__)


class Apply(Protocol):
    def __call__(
        self, settings: PolicySettings, version: int, timeout: float | None = None
    ) -> None:
        """Put settings into force (engine, scheduler, metrics). Raises ``TimeoutError`` when
        the engine has not taken them within ``timeout`` (the version stays pending and is
        retried), any other exception when it refused them (the version failed)."""


class VersionConflict(RuntimeError):
    pass


class VersionNotFound(LookupError):
    pass


class StoreUnavailable(RuntimeError):
    """The database refused a policy write (503 naming the cause). ``version`` is None when
    nothing was stored (nothing changed in the engine either); otherwise that version is
    stored and only its state could not be written: it reads ``pending`` until the reconcile
    job records it, and ``in_force`` says whether the engine runs it already."""

    def __init__(self, cause: BaseException, version: int | None = None, in_force: bool = False):
        self.cause = unavailable(cause)
        self.version = version
        self.in_force = in_force
        if version is None:
            message = f"{self.cause}: nothing was stored"
        else:
            engine = "the engine runs it" if in_force else "the engine has not taken it yet"
            message = (
                f"{self.cause}: version {version} is stored and {engine}; its state could not "
                "be written, so it reads pending until the reconcile job records it"
            )
        super().__init__(message)


class PolicyStore:
    def __init__(
        self,
        limits: EngineLimits,
        apply: Apply,
        metrics: ControlMetrics,
        overrides: dict[str, object] | None = None,
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
        row = newest_row(session)
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

    def effective_params(self, spec: PolicySpec) -> dict[str, Any]:  # Any: a policy's params
        """Every param in force; a ``None`` default means the engine cap, shown as its value."""
        if spec.params.over_caps(self.limits):  # stored params that no longer fit: the
            spec = default_spec(spec.name)  # engine took the defaults
        return spec.params.effective(self.limits)

    def _sources(self, row: PolicyVersion, settings: PolicySettings) -> dict[str, Source]:
        def top(field: str) -> Source:
            if field in self._overrides:
                return "override"
            return "stored" if field in row.explicit else "default"

        sources: dict[str, Source] = {"policy.name": top("policy.name")}
        params = settings.policy.params
        for field in type(params).model_fields:
            given = field in params.model_fields_set
            sources[f"policy.params.{field}"] = "stored" if given else "default"
        sources["queue.name"] = top("queue.name")
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

    def validate(self, raw: Any) -> PolicyUpdate:  # Any: a request body, JSON not yet read
        """Validate a PUT body against the live engine, once: raise SettingsInvalid naming
        every failing field, including policy params checked against the engine caps."""
        try:
            return parse_body(PolicyUpdate, raw, self.limits)
        except SettingsInvalid:
            self._metrics.count_policy_update("invalid")
            raise

    # -- writing ---------------------------------------------------------------------------

    def update(
        self,
        session: Session,
        update: PolicyUpdate,
        actor: str,
        if_match: int | None = None,
        dry_run: bool = False,
    ) -> PolicyUpdateResult:
        with self._lock:
            row = self._current(session, if_match)
            before = self.effective(row)
            after = PolicySettings(
                policy=update.policy or before.policy,
                queue=update.queue or before.queue,
                memory_reserve=_given(update.memory_reserve, before.memory_reserve),
                reclaim_interval_s=_given(update.reclaim_interval_s, before.reclaim_interval_s),
            )
            given = {
                "policy.name": update.policy,
                "queue.name": update.queue,
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
                    stored=False,
                    version=row.version,
                    diff=diff(before, after),
                    settings=after,
                    status=None,
                )
            status = status_of(row)
            # Equal settings store nothing, unless the active version failed: then they retry.
            if status.state != "failed" and self.same_effect(before, after):
                self._metrics.count_policy_update("unchanged")
                return PolicyUpdateResult(
                    dry_run=False,
                    applied=status.state == "applied",
                    stored=False,
                    version=row.version,
                    diff=[],
                    settings=before,
                    status=status,
                )
            return self._store(session, row, before, after, explicit, actor, update.reason, None)

    def same_effect(self, before: PolicySettings, after: PolicySettings) -> bool:
        """Whether two settings run the engine the same way: same policy, same params once
        defaults and engine caps are filled in (``{}`` equals every default written out), same
        reserve and sweep interval. A PUT that changes nothing in effect stores nothing, so
        applying a policy file again (``servedeck policy apply -f``) is idempotent."""
        return (
            before.policy.name == after.policy.name
            and self.effective_params(before.policy) == self.effective_params(after.policy)
            and before.queue == after.queue
            and before.memory_reserve == after.memory_reserve
            and before.reclaim_interval_s == after.reclaim_interval_s
        )

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
            try:
                check_caps(after.policy, self.limits)
            except ValidationError as exc:
                self._metrics.count_policy_update("invalid")
                raise SettingsInvalid(
                    pydantic_errors(exc, ("version", version, "policy"))
                ) from None
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
        version = row.version + 1
        new = new_row(version, after, sorted(explicit), actor, reason, before, rollback_of)
        session.add(new)
        try:
            session.commit()  # stored (pending) before the engine is asked: the change is kept
        except OperationalError as exc:  # not stored: the engine is not asked
            session.rollback()
            self._metrics.count_policy_update("unavailable")
            raise StoreUnavailable(exc) from None
        self._overrides.clear()
        state, why = self._take(after, version)
        try:
            status = self.mark(session, version, state, why)
        except Exception as exc:  # stored; whatever refused the state write, the row is pending
            session.rollback()
            log.warning(
                "policy version %d is stored; its state %s was not written: %s",
                version,
                state,
                exc,
            )
            self._metrics.count_policy_update("unavailable")
            raise StoreUnavailable(exc, version, in_force=state == "applied") from None
        self._metrics.count_policy_update(status.state)
        return PolicyUpdateResult(
            dry_run=False,
            applied=status.state == "applied",
            stored=True,
            version=version,
            diff=diff(before, after),
            settings=after,
            status=status,
        )

    # -- putting versions into force -------------------------------------------------------

    def _take(
        self, settings: PolicySettings, version: int, timeout: float | None = None
    ) -> tuple[VersionState, str | None]:
        """Ask the engine to put a stored version into force: the state it reached, and why."""
        try:
            self._apply(settings, version, timeout)
        except TimeoutError:
            return "pending", "the engine has not taken it yet; retried until it is in force"
        except Exception as exc:
            log.exception("policy version %d could not be put into force", version)
            return "failed", f"{type(exc).__name__}: {exc}"
        return "applied", None

    def reconcile(self, session: Session, timeout: float | None = None) -> VersionStatus | None:
        """Retry the newest version while it is pending (a maintenance job calls this, each
        attempt bounded by ``timeout``); its status, or None when there was nothing to do."""
        with self._lock:
            row = newest_row(session)
            if row is None or row.state != "pending":
                return None
            state, why = self._take(self.effective(row), row.version, timeout)
            status = self.mark(session, row.version, state, why)
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
                .where(col(PolicyVersion.version) < version, col(PolicyVersion.state) == "pending")
                .values(
                    state="failed",
                    state_reason=f"superseded by version {version} before it was in force",
                    state_at=now,
                )
            )
        session.commit()
        session.expire_all()
        return VersionStatus(state=state, state_reason=reason, state_at=now)


def _given(value: float | None, current: float) -> float:
    return current if value is None else value
