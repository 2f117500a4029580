"""Crontab's meaning, not APScheduler's: weekday numbers count from Sunday (APScheduler 3's
``from_crontab`` reads 6 as Sunday), and day-of-month with day-of-week is refused (crontab ORs
them, APScheduler ANDs them)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from control.schedules.windows import cron_trigger, crontab_weekdays


@pytest.mark.parametrize(
    ("field", "names"),
    [
        ("*", "*"),
        ("0", "sun"),
        ("7", "sun"),
        ("6", "sat"),
        ("1-5", "mon,tue,wed,thu,fri"),
        ("0-6", "*"),
        ("5-7", "sun,fri,sat"),
        ("*/2", "sun,tue,thu,sat"),
        ("1/2", "sun,mon,wed,fri"),
        ("1,3,5", "mon,wed,fri"),
        ("SAT", "sat"),
        ("mon-fri", "mon,tue,wed,thu,fri"),
    ],
)
def test_weekday_fields_mean_what_crontab_means(field: str, names: str) -> None:
    assert crontab_weekdays(field) == names


@pytest.mark.parametrize("field", ["8", "5-2", "*/0", "funday", "1-x"])
def test_bad_weekday_fields_are_refused(field: str) -> None:
    with pytest.raises(ValueError):
        crontab_weekdays(field)


def test_saturday_fires_on_saturday() -> None:
    after = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)  # a Sunday
    fire = cron_trigger("30 2 * * 6", "UTC").get_next_fire_time(None, after)
    assert fire is not None and fire.strftime("%a %d %H:%M") == "Sat 05 02:30"
    sunday = cron_trigger("30 2 * * 0", "UTC").get_next_fire_time(None, after)
    assert sunday is not None and sunday.strftime("%a %d") == "Sun 06"
    seconds = cron_trigger("30 2 * * 6", "UTC", "15").get_next_fire_time(None, after)
    assert seconds is not None and seconds.strftime("%a %H:%M:%S") == "Sat 02:30:15"


def test_day_of_month_and_weekday_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        cron_trigger("0 1 13 * 5", "UTC")
    with pytest.raises(ValueError, match="5 fields"):
        cron_trigger("0 1 * *", "UTC")
