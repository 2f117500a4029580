"""The schedules API's bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictStr,
    field_validator,
)

from control.api.openai_fields import JsonInt
from control.policy.schemas import REASON_PATTERN, memory_reserve_field
from control.schedules.windows import (
    TIMEZONE_MAX_LENGTH,
    check_fires,
    cron_trigger,
    wall_time,
    zone,
)
from policies.spec import PolicySpec


class ScheduleCreate(BaseModel):
    """A policy window: from each ``cron`` firing (in ``timezone``) until the next ``until``
    wall time there. Overlapping windows: the higher ``priority`` wins, then the latest start."""

    model_config = ConfigDict(extra="forbid")

    cron: StrictStr = Field(
        description="Crontab (5 fields: minute hour day month weekday) that fires within the "
        "next five years."
    )
    cron_seconds: StrictStr | None = Field(
        None, description="Optional cron seconds field (e.g. `30`, `*/10`); crontab has none."
    )
    until: StrictStr = Field(description="Local wall time HH:MM[:SS] the window ends at.")
    timezone: StrictStr = Field(
        "UTC", max_length=TIMEZONE_MAX_LENGTH, description="IANA zone of cron and until."
    )
    policy: PolicySpec
    memory_reserve: StrictFloat | None = memory_reserve_field(None)
    reason: str = Field(min_length=1, pattern=REASON_PATTERN, description="Why: required.")
    priority: JsonInt = Field(0, ge=-1000, le=1000, description="Higher wins an overlap.")

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        cron_trigger(value, "UTC")
        check_fires(value)  # 30 February: refused here, never searched for on every tick
        return value

    @field_validator("cron_seconds")
    @classmethod
    def _cron_seconds(cls, value: str | None) -> str | None:
        if value is not None:
            cron_trigger("* * * * *", "UTC", value)
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("until")
    @classmethod
    def _until(cls, value: str) -> str:
        wall_time(value)
        return value


class ScheduleChangeView(BaseModel):
    action: Literal["create", "delete"]
    actor: str
    reason: str
    # A schedule's public fields as the audit stored them, JSON: a row written by an older
    # version keeps the fields it had then, so no model of today's reads it back.
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    at: datetime


class ScheduleView(BaseModel):
    id: int
    cron: str
    cron_seconds: str | None
    until: str
    timezone: str
    policy: PolicySpec
    memory_reserve: float | None
    reason: str
    priority: int
    actor: str
    created_at: datetime
    next_run_at: datetime | None = Field(description="The next firing (UTC).")
    active: bool = Field(description="Its window is the one in force now.")
    window_start: datetime | None = Field(description="Start of the window it last applied.")
    applied_version: int | None = Field(description="The version that applied that window.")
    last_end_at: datetime | None
    last_end: str | None = Field(description="What the last end did: restored, or kept.")


class ScheduleDetail(ScheduleView):
    next_firings: list[datetime] = Field(description="The next firings (UTC), with their ends.")
    next_ends: list[datetime]
    changes: list[ScheduleChangeView]


class ScheduleList(BaseModel):
    items: list[ScheduleView]
    active: int | None = Field(description="Id of the schedule whose window is in force.")
