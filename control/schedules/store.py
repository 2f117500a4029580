"""Stored schedules and the job that puts their windows into force.

Every transition goes through ``PolicyStore.update`` (versions, states and audit stay one
mechanism) with actor ``schedule:<id>``:

- a window starts (or is found in force after a restart and not yet applied): its setting is
  stored as a new version; the schedule row keeps that version and the window's start;
- a window ends: when every version after the one it applied is a schedule's, the setting in
  force before the run of schedule versions is restored as a new version; when a person (any
  other actor) changed the setting meanwhile, their change stands and the end is recorded on
  the schedule row without a change; when another window takes over, its setting applies.

Writes carry ``If-Match`` of the version read, so a person's PUT in between wins and the job
retries on its next tick. Creating and deleting schedules is recorded in ``schedule_change``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from control.core.config import DEFAULT_MAX_SCHEDULES
from control.metrics import ControlMetrics
from control.models import PolicyVersion, Schedule, as_utc, utcnow
from control.policy.checks import SettingsInvalid, pydantic_errors
from control.policy.schemas import PolicySettings, PolicyUpdate
from control.policy.store import PolicyStore, VersionConflict
from control.schedules.schemas import ScheduleCreate, ScheduleDetail, ScheduleList, ScheduleView
from control.schedules.views import audit, detail_of, public, spec_of, view_of
from control.schedules.windows import FiringCache
from policies.spec import PolicySpec, check_caps, parse_spec

log = logging.getLogger(__name__)

JOB_ID = "schedule_windows"
TICK_S = 1.0
ACTOR_PREFIX = "schedule:"


class ScheduleNotFound(LookupError):
    pass


def too_many(cap: int) -> dict[str, object]:
    """The 422 error past ``max_schedules`` (``loc`` the body: no one field is at fault)."""
    return {
        "type": "too_many_schedules",
        "loc": (),
        "msg": f"at most {cap} live schedules (max_schedules): delete one first",
        "input": None,
        "ctx": {"max_schedules": cap},
    }


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Schedules:
    def __init__(
        self,
        db: Engine,
        store: PolicyStore,
        metrics: ControlMetrics,
        clock: Callable[[], datetime] = utcnow,
        max_schedules: int = DEFAULT_MAX_SCHEDULES,
    ) -> None:
        self._db = db
        self._store = store
        self._metrics = metrics
        self._max = max_schedules
        self._clock = clock
        self._firings = FiringCache()
        self._published: tuple[int | None, list[int]] | None = None

    # -- reading ---------------------------------------------------------------------------

    def _live(self, session: Session) -> list[Schedule]:
        query = select(Schedule).where(col(Schedule.deleted_at).is_(None))
        return list(session.exec(query.order_by(col(Schedule.id))).all())

    def _row(self, session: Session, schedule_id: int) -> Schedule:
        row = session.get(Schedule, schedule_id)
        if row is None or row.deleted_at is not None:
            raise ScheduleNotFound(f"schedule {schedule_id} does not exist")
        return row

    def list(self, session: Session) -> ScheduleList:
        now = self._clock()
        rows = self._live(session)
        window = self._firings.active_window([spec_of(r) for r in rows], now)
        active = window.schedule_id if window else None
        items = [view_of(r, self._firings.next_run(spec_of(r), now), active) for r in rows]
        return ScheduleList(items=items, active=active)

    def in_force(self, now: datetime | None = None) -> int | None:
        """The id of the schedule whose window is in force at ``now`` (default: the clock),
        by the same ``active_window`` the job uses; None when no window is open."""
        moment = self._clock() if now is None else now
        with Session(self._db) as session:
            window = self._firings.active_window([spec_of(r) for r in self._live(session)], moment)
        return window.schedule_id if window else None

    def get(self, session: Session, schedule_id: int) -> ScheduleDetail:
        now = self._clock()
        row = self._row(session, schedule_id)
        window = self._firings.active_window([spec_of(r) for r in self._live(session)], now)
        return detail_of(session, row, now, window.schedule_id if window else None)

    # -- writing ---------------------------------------------------------------------------

    def create(self, session: Session, body: ScheduleCreate, actor: str) -> ScheduleView:
        """``body`` as validated at the edge (the engine caps included)."""
        row = Schedule(
            **body.model_dump(exclude={"policy"}),
            policy_name=body.policy.name,
            policy_params=body.policy.params.model_dump(mode="json"),
            actor=actor,
        )
        session.add(row)
        session.flush()  # the write lock, held to the commit: creates are counted one at a time
        assert row.id is not None
        live = session.exec(
            select(func.count()).select_from(Schedule).where(col(Schedule.deleted_at).is_(None))
        ).one()
        if live > self._max:
            session.rollback()
            raise SettingsInvalid([too_many(self._max)])
        audit(session, row.id, "create", actor, body.reason, None, public(row))
        session.commit()
        session.refresh(row)
        log.info("schedule %d created by %s: %s until %s", row.id, actor, row.cron, row.until)
        return view_of(row, self._firings.next_run(spec_of(row), self._clock()), None)

    def delete(self, session: Session, schedule_id: int, actor: str, reason: str) -> ScheduleView:
        row = self._row(session, schedule_id)
        before = public(row)
        row.deleted_at = utcnow()
        session.add(row)
        audit(session, schedule_id, "delete", actor, reason, before, None)
        session.commit()
        session.refresh(row)
        return view_of(row, None, None)

    # -- the job ---------------------------------------------------------------------------

    def tick(self) -> None:
        """Put the window in force now into force, and end those that ended (the job)."""
        now = self._clock()
        with Session(self._db) as session:
            live = self._live(session)
            window = self._firings.active_window([spec_of(r) for r in live], now)
            windows = (window.schedule_id if window else None, [r.id for r in live if r.id])
            if windows != self._published:  # the gauge is rewritten only when it changes
                self._metrics.set_schedule_windows(*windows)
                self._published = windows
            holding = session.exec(
                select(Schedule).where(col(Schedule.applied_version).is_not(None))
            ).all()
            for row in holding:
                same = window is not None and row.id == window.schedule_id
                # `same` implies a window; a row holding one has its window_start
                if not (same and as_utc(row.window_start) == window.start):  # type: ignore[union-attr, arg-type]
                    self._end(session, row, now, window.schedule_id if window else None)
            if window is not None:
                row = self._row(session, window.schedule_id)
                start = row.window_start and as_utc(row.window_start)
                if row.applied_version is None and start != window.start:
                    self._start(session, row, window.start, window.end)

    def _start(self, session: Session, row: Schedule, start: datetime, end: datetime) -> None:
        newest = self._store.newest(session)
        update = PolicyUpdate(
            policy=spec_of_row(row),
            memory_reserve=row.memory_reserve,
            reason=f"schedule {row.id}: window {_stamp(start)} to {_stamp(end)}: {row.reason}",
        )
        try:
            if update.policy is not None:  # a stored row, checked against this engine's caps
                try:
                    check_caps(update.policy, self._store.limits)
                except ValidationError as exc:
                    raise SettingsInvalid(pydantic_errors(exc, ("policy",))) from None
            result = self._store.update(
                session, update, f"{ACTOR_PREFIX}{row.id}", if_match=newest.version
            )
        except VersionConflict:
            return  # a change came in between: next tick
        except SettingsInvalid as exc:
            log.error("schedule %s: its setting does not fit this engine: %s", row.id, exc)
            result = None
        applied = result.version if result is not None else None
        if result is not None and not result.stored:  # its setting was in force already
            newest = self._store.newest(session)
            applied = newest.version if newest.actor.startswith(ACTOR_PREFIX) else None
        row.window_start = start
        row.applied_version = applied
        session.add(row)
        session.commit()
        log.info("schedule %s window started: version %s", row.id, row.applied_version)

    def _end(self, session: Session, row: Schedule, now: datetime, next_id: int | None) -> None:
        assert row.applied_version is not None
        newest = self._store.newest(session)
        person = session.exec(
            select(PolicyVersion)
            .where(col(PolicyVersion.version) > row.applied_version)
            .where(col(PolicyVersion.actor).not_like(f"{ACTOR_PREFIX}%"))
            .order_by(col(PolicyVersion.version).desc())
        ).first()
        if next_id is not None:
            outcome = f"superseded by schedule {next_id}"
        elif person is not None:
            outcome = f"kept: {person.actor} changed the setting (version {person.version})"
        elif (before := self._restore_target(session)) is None:
            outcome = "kept: no setting from before the schedules to restore"
        else:
            update = PolicyUpdate(
                policy=before.policy,
                memory_reserve=before.memory_reserve,
                reclaim_interval_s=before.reclaim_interval_s,
                reason=f"schedule {row.id}: window ended; restoring the setting before it",
            )
            try:
                result = self._store.update(
                    session, update, f"{ACTOR_PREFIX}{row.id}", if_match=newest.version
                )
            except VersionConflict:
                return
            stored = "restored in version" if result.stored else "already in force: version"
            outcome = f"{stored} {result.version}"
        row.applied_version = None
        if next_id is not None:
            row.window_start = None  # its window, if still open, applies again when it wins
        row.last_end_at = now
        row.last_end = outcome
        session.add(row)
        session.commit()
        log.info("schedule %s window ended: %s", row.id, outcome)

    def _restore_target(self, session: Session) -> PolicySettings | None:
        """The ``before`` of the oldest version in the newest run of schedule versions: the
        setting in force before the schedules took over (None when there is no such run)."""
        rows = session.exec(select(PolicyVersion).order_by(col(PolicyVersion.version).desc()))
        oldest: PolicyVersion | None = None
        for version in rows:
            if not version.actor.startswith(ACTOR_PREFIX):
                break
            oldest = version
        if oldest is None or oldest.before is None:
            return None
        return PolicySettings.model_validate(oldest.before)


def spec_of_row(row: Schedule) -> PolicySpec:
    """A schedule's stored spec, parsed once (the engine caps are checked when it applies)."""
    return parse_spec({"name": row.policy_name, "params": row.policy_params})
