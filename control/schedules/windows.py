"""Schedule windows: which schedule is in force at a given moment — a pure function of
(schedules, now), built on APScheduler 3's ``CronTrigger.get_next_fire_time``.

A window starts at a firing of the schedule's cron (in its time zone) and ends at the first
``until`` local wall time in that zone after the start — the same day, or the next one when
``until`` is not later than the start (a window may end after midnight). Windows are at most
one day long, so only the latest firing at or before ``now`` can hold ``now``.

Daylight saving follows the zone's rules: a firing APScheduler finds in a skipped hour moves to
the first valid time after it; an ``until`` in a skipped hour is read with the offset before the
change (02:30 on the spring-forward night in Europe/Berlin is 03:30 CEST), and an ``until`` in a
repeated hour means its first occurrence (summer time).

Overlaps resolve by priority (higher wins), then by latest start, then by higher id.
Everything is compared in UTC: aware datetimes sharing a tzinfo compare by wall time.

Cost: APScheduler walks a trigger's fields until it finds a firing, up to the year 9999, so one
``get_next_fire_time`` on a cron that never fires (30 February) took 0.2-0.5 s. Every search
here is given an end (``end_date``): the window search ends at ``now``, a search for the next
firing ``HORIZON`` ahead, so no call costs more than the span it searches. ``FiringCache``
(what the job and the API read) keeps each schedule's last and next firing and searches again
only once the next firing has passed, so a tick costs a dictionary look-up per schedule.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

LOOKBACK = timedelta(days=1, hours=2)
"""How far back a firing can start a window that still holds ``now`` (windows are <= 1 day)."""
MAX_STEPS = 10_000
HORIZON = timedelta(days=5 * 365 + 2)
"""How far ahead firings are looked for: a cron with none in the next five years is refused
(``check_fires``), and a stored one shows no next run. 29 February fires every four years."""


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """What the window logic needs of a schedule."""

    id: int
    cron: str
    until: str
    timezone: str
    priority: int = 0
    cron_seconds: str | None = None


@dataclass(frozen=True, slots=True)
class Window:
    schedule_id: int
    start: datetime  # UTC
    end: datetime  # UTC
    priority: int


TIMEZONE_MAX_LENGTH = 255
"""Longer is no IANA name (the longest are about 30 characters) and no file name either."""


def zone(name: str) -> ZoneInfo:
    """The IANA zone; ValueError naming it when it is none. ``ZoneInfo`` looks a name up as a
    file: besides not finding it, it raises ValueError (a path, a file that is no zone), and
    OSError (a folder such as ``America``, a name too long for the file system)."""
    if len(name) > TIMEZONE_MAX_LENGTH:
        raise ValueError(f"unknown time zone: longer than {TIMEZONE_MAX_LENGTH} characters")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown time zone {name!r}") from exc


WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
"""Crontab's weekday numbers: 0 (and 7) is Sunday. APScheduler 3 numbers from Monday = 0, so
numbers are never handed to it: the field is rewritten as the names it means."""


def crontab_weekdays(field: str) -> str:
    """A crontab day-of-week field (numbers 0-7, names, ranges, lists, steps) as the list of
    weekday names it means (``*`` when every day); ValueError naming what is wrong."""
    days: set[int] = set()
    for item in field.lower().split(","):
        base, _, step_text = item.partition("/")
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if step_text and step is None:
            raise ValueError(f"bad step in day of week {field!r}")
        if base == "*":
            lo, hi = 0, 6
        else:
            first, _, last = base.partition("-")
            lo, hi = _weekday(first, field), _weekday(last or first, field)
            if step and not last:
                hi = 7 if lo else 6
            if lo > hi:
                raise ValueError(f"day-of-week range {base!r} runs backwards in {field!r}")
        days |= {d % 7 for d in range(lo, hi + 1, step or 1)}
    return "*" if len(days) == 7 else ",".join(WEEKDAYS[d] for d in sorted(days))


def _weekday(text: str, field: str) -> int:
    if text.isdigit() and int(text) <= 7:
        return int(text)
    if text[:3] in WEEKDAYS and len(text) == 3:
        return WEEKDAYS.index(text)
    raise ValueError(f"bad day of week {text!r} in {field!r} (0-7 or sun-sat)")


def cron_trigger(
    cron: str, timezone: str, cron_seconds: str | None = None, end: datetime | None = None
) -> CronTrigger:
    """The trigger of a crontab expression (5 fields) in ``timezone``; ``cron_seconds`` (a cron
    field such as ``30`` or ``*/10``) adds the seconds field crontab has not; ValueError when
    either is malformed. ``end`` bounds every search: past it the trigger answers None at once.

    Crontab's meaning is kept where APScheduler's differs: weekday numbers count from Sunday
    (``crontab_weekdays``), and an expression restricting both the day of the month and the
    day of the week is refused (crontab fires on either, APScheduler only on both)."""
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError(f"cron needs 5 fields (minute hour day month weekday), got {cron!r}")
    minute, hour, day, month, day_of_week = fields
    if day != "*" and day_of_week != "*":
        raise ValueError(
            "restrict the day of the month or the day of the week, not both "
            f"({cron!r}: crontab fires on either, this scheduler only on both)"
        )
    return CronTrigger(
        second=cron_seconds if cron_seconds is not None else "0",
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=crontab_weekdays(day_of_week),
        timezone=zone(timezone),
        end_date=end,
    )


def check_fires(cron: str, now: datetime | None = None) -> None:
    """ValueError when ``cron`` (valid) has no firing within ``HORIZON`` of ``now`` (default:
    the wall clock), such as 30 February or 31 June. One bounded search: ~0.1 ms."""
    moment = datetime.now(UTC) if now is None else now.astimezone(UTC)
    trigger = cron_trigger(cron, "UTC", end=moment + HORIZON)
    if trigger.get_next_fire_time(None, moment) is None:
        raise ValueError(f"cron {cron!r} never fires in the next five years")


def wall_time(until: str) -> time:
    """``HH:MM`` or ``HH:MM:SS``; ValueError otherwise."""
    try:
        parsed = time.fromisoformat(until)
    except ValueError:
        raise ValueError(f"until must be a wall time HH:MM or HH:MM:SS, not {until!r}") from None
    if parsed.tzinfo is not None or parsed.microsecond:
        raise ValueError(f"until must be a wall time HH:MM or HH:MM:SS, not {until!r}")
    return parsed


def window_end(start: datetime, until: str, timezone: str) -> datetime:
    """The first ``until`` wall time in the zone after ``start`` (UTC)."""
    tz = zone(timezone)
    local = start.astimezone(tz)
    end = datetime.combine(local.date(), wall_time(until), tzinfo=tz).astimezone(UTC)
    if end <= start:
        next_day = local.date() + timedelta(days=1)
        end = datetime.combine(next_day, wall_time(until), tzinfo=tz).astimezone(UTC)
    return end


def next_firings(spec: WindowSpec, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` firings at or after ``after`` (UTC) within ``HORIZON``."""
    trigger = cron_trigger(spec.cron, spec.timezone, spec.cron_seconds, after + HORIZON)
    firings: list[datetime] = []
    previous: datetime | None = None
    moment = after
    while len(firings) < count:
        fire = trigger.get_next_fire_time(previous, moment)
        if fire is None:
            break
        fire = fire.astimezone(UTC)
        firings.append(fire)
        previous, moment = fire, fire + timedelta(microseconds=1)
    return firings


def last_firing(spec: WindowSpec, now: datetime) -> datetime | None:
    """The latest firing at or before ``now`` within ``LOOKBACK`` (UTC), or None. Every search
    ends at ``now``, so each costs at most what ``LOOKBACK`` holds (about 20 searches)."""
    trigger = cron_trigger(spec.cron, spec.timezone, spec.cron_seconds, now)
    step = timedelta(seconds=1)
    found: datetime | None = None
    while found is None:  # look back 1 s, 2 s, 4 s ... until a firing lies in [now - step, now]
        since = now - min(step, LOOKBACK)
        fire = trigger.get_next_fire_time(None, since)
        if fire is not None and fire.astimezone(UTC) <= now:
            found = fire.astimezone(UTC)
        elif step >= LOOKBACK:
            return None
        step *= 2
    for _ in range(MAX_STEPS):  # then forward to the last one at or before now
        fire = trigger.get_next_fire_time(found, found + timedelta(microseconds=1))
        if fire is None or fire.astimezone(UTC) > now:
            break
        found = fire.astimezone(UTC)
    return found


@dataclass(frozen=True, slots=True)
class Firings:
    """A schedule's firings around ``at``: ``last`` the latest at or before it (within
    ``LOOKBACK``) and the window it starts, ``upcoming`` the first after it (None: none before
    ``at + HORIZON``). They hold for every moment from ``at`` up to ``upcoming``: no firing lies
    in between."""

    at: datetime
    last: datetime | None
    window: Window | None
    upcoming: datetime | None

    def hold(self, now: datetime) -> bool:
        return self.at <= now < (self.upcoming or self.at + HORIZON)

    def window_at(self, now: datetime) -> Window | None:
        return self.window if self.window is not None and now < self.window.end else None


def _window(spec: WindowSpec, start: datetime | None) -> Window | None:
    if start is None:
        return None
    return Window(spec.id, start, window_end(start, spec.until, spec.timezone), spec.priority)


def firings_at(spec: WindowSpec, now: datetime) -> Firings:
    now = now.astimezone(UTC)
    last = last_firing(spec, now)
    after = next_firings(spec, now + timedelta(microseconds=1), 1)
    return Firings(now, last, _window(spec, last), after[0] if after else None)


def window_at(spec: WindowSpec, now: datetime) -> Window | None:
    """The window of ``spec`` that holds ``now``, if any."""
    now = now.astimezone(UTC)
    window = _window(spec, last_firing(spec, now))
    return window if window is not None and now < window.end else None


def _choose(windows: list[Window]) -> Window | None:
    if not windows:
        return None
    return max(windows, key=lambda w: (w.priority, w.start, w.schedule_id))


def active_window(specs: list[WindowSpec], now: datetime) -> Window | None:
    """The window in force at ``now``: of those holding it, the highest priority, then the
    latest start, then the highest schedule id."""
    return _choose([w for spec in specs if (w := window_at(spec, now)) is not None])


class FiringCache:
    """``active_window`` and each schedule's next run, with each schedule's ``Firings`` kept
    until its next firing passes (or the clock goes back): a schedule costs its searches once
    per firing, a dictionary look-up on every other call. Entries are keyed by the whole spec,
    so a changed schedule is searched afresh; ``active_window`` drops those no longer given.
    Safe to share between threads (the job's and the API's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._firings: dict[WindowSpec, Firings] = {}

    def firings(self, spec: WindowSpec, now: datetime) -> Firings:
        now = now.astimezone(UTC)
        with self._lock:
            known = self._firings.get(spec)
        if known is not None and known.hold(now):
            return known
        fresh = firings_at(spec, now)
        with self._lock:
            self._firings[spec] = fresh
        return fresh

    def next_run(self, spec: WindowSpec, now: datetime) -> datetime | None:
        """The first firing at or after ``now`` (within ``HORIZON``)."""
        firings = self.firings(spec, now)
        return firings.last if firings.last == now.astimezone(UTC) else firings.upcoming

    def active_window(self, specs: list[WindowSpec], now: datetime) -> Window | None:
        """``active_window(specs, now)``; forgets the schedules not in ``specs``."""
        now = now.astimezone(UTC)
        windows = [w for spec in specs if (w := self.firings(spec, now).window_at(now))]
        with self._lock:
            for gone in self._firings.keys() - set(specs):
                del self._firings[gone]
        return _choose(windows)
