"""What the schedule API answers and what its audit records, built from the stored rows.

``Schedules`` (control/schedules/store.py) owns the rows and the job; the response models
(``ScheduleView``, ``ScheduleDetail``) and the ``schedule_change`` audit rows are built here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from control.models import Schedule, ScheduleChange, as_utc
from control.schedules.schemas import ScheduleChangeView, ScheduleDetail, ScheduleView
from control.schedules.windows import WindowSpec, next_firings, window_end

PREVIEW = 5
"""Firings previewed by ``GET /admin/schedules/{id}``."""

PUBLIC_FIELDS = frozenset(
    (
        "cron",
        "cron_seconds",
        "until",
        "timezone",
        "policy_name",
        "policy_params",
        "memory_reserve",
        "reason",
        "priority",
    )
)
"""The fields of a schedule its audit rows record (before/after)."""


def spec_of(row: Schedule) -> WindowSpec:
    assert row.id is not None
    return WindowSpec(row.id, row.cron, row.until, row.timezone, row.priority, row.cron_seconds)


def view_of(row: Schedule, next_run: datetime | None, active: int | None) -> ScheduleView:
    """The schedule as listed: ``next_run`` its next firing (``FiringCache.next_run``),
    ``active`` the id of the schedule in force (if any)."""
    return ScheduleView.model_validate(
        {
            **row.model_dump(),
            "policy": {"name": row.policy_name, "params": row.policy_params},
            "created_at": as_utc(row.created_at),
            "window_start": row.window_start and as_utc(row.window_start),
            "last_end_at": row.last_end_at and as_utc(row.last_end_at),
            "next_run_at": next_run,
            "active": row.id == active,
        }
    )


def detail_of(session: Session, row: Schedule, now: datetime, active: int | None) -> ScheduleDetail:
    """The schedule with its next firings and ends previewed and its audit trail."""
    assert row.id is not None
    firings = next_firings(spec_of(row), now, PREVIEW)
    changes = session.exec(
        select(ScheduleChange)
        .where(ScheduleChange.schedule_id == row.id)
        .order_by(col(ScheduleChange.id))
    ).all()
    return ScheduleDetail(
        **view_of(row, firings[0] if firings else None, active).model_dump(),
        next_firings=firings,
        next_ends=[window_end(f, row.until, row.timezone) for f in firings],
        changes=[
            ScheduleChangeView.model_validate(c.model_dump() | {"at": as_utc(c.at)})
            for c in changes
        ],
    )


def public(row: Schedule) -> dict[str, Any]:  # JSON: the audit's before/after (schemas.py)
    return row.model_dump(mode="json", include=set(PUBLIC_FIELDS))


def audit(
    session: Session,
    schedule_id: int,
    action: str,
    actor: str,
    reason: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    """Add a ``schedule_change`` row (committed with the change it records)."""
    session.add(
        ScheduleChange(
            schedule_id=schedule_id,
            action=action,
            actor=actor,
            reason=reason,
            before=before,
            after=after,
        )
    )
