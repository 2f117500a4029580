"""The window logic as a pure function of (schedules, now), on given datetimes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from control.schedules import WindowSpec, active_window, cron_trigger, next_firings, window_at

BERLIN = "Europe/Berlin"
NIGHT = WindowSpec(id=1, cron="0 1 * * *", until="05:00", timezone=BERLIN)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_nightly_window_in_winter_is_00_to_04_utc() -> None:
    assert window_at(NIGHT, utc(2026, 1, 15, 23, 59)) is None
    window = window_at(NIGHT, utc(2026, 1, 16, 0, 0))
    assert window is not None
    assert (window.start, window.end) == (utc(2026, 1, 16, 0), utc(2026, 1, 16, 4))
    assert window_at(NIGHT, utc(2026, 1, 16, 3, 59, 59)) is not None
    assert window_at(NIGHT, utc(2026, 1, 16, 4, 0)) is None


def test_window_past_midnight_ends_the_next_day() -> None:
    late = WindowSpec(id=2, cron="0 22 * * *", until="02:00", timezone=BERLIN)
    window = window_at(late, utc(2026, 1, 16, 0, 30))  # 01:30 Berlin
    assert window is not None
    assert (window.start, window.end) == (utc(2026, 1, 15, 21), utc(2026, 1, 16, 1))


def test_spring_forward_night_is_one_hour_shorter() -> None:
    # 2026-03-29: 02:00 CET -> 03:00 CEST. 01:00 CET = 00:00 UTC, 05:00 CEST = 03:00 UTC.
    window = window_at(NIGHT, utc(2026, 3, 29, 0, 30))
    assert window is not None
    assert (window.start, window.end) == (utc(2026, 3, 29, 0), utc(2026, 3, 29, 3))
    assert window_at(NIGHT, utc(2026, 3, 29, 3, 0)) is None


def test_fall_back_night_is_one_hour_longer() -> None:
    # 2026-10-25: 03:00 CEST -> 02:00 CET. 01:00 CEST = 23:00 UTC, 05:00 CET = 04:00 UTC.
    window = window_at(NIGHT, utc(2026, 10, 25, 3, 30))
    assert window is not None
    assert (window.start, window.end) == (utc(2026, 10, 24, 23), utc(2026, 10, 25, 4))
    assert window.end - window.start == datetime(2, 1, 1, 5) - datetime(2, 1, 1)


def test_until_in_the_skipped_hour_uses_the_offset_before_the_change() -> None:
    spec = WindowSpec(id=3, cron="0 1 * * *", until="02:30", timezone=BERLIN)
    window = window_at(spec, utc(2026, 3, 29, 0, 10))
    assert window is not None
    assert window.end == utc(2026, 3, 29, 1, 30)  # 02:30 CET = 03:30 CEST


def test_firing_in_the_skipped_hour_moves_after_it() -> None:
    spec = WindowSpec(id=4, cron="30 2 * * *", until="06:00", timezone=BERLIN)
    firings = next_firings(spec, utc(2026, 3, 28, 12), 2)
    assert firings[0] >= utc(2026, 3, 29, 1)  # not before 03:00 CEST
    assert firings[1] == utc(2026, 3, 30, 0, 30)  # 02:30 CEST


def test_overlaps_resolve_by_priority_then_latest_start() -> None:
    base = WindowSpec(id=1, cron="0 1 * * *", until="05:00", timezone=BERLIN, priority=0)
    later = WindowSpec(id=2, cron="0 2 * * *", until="03:00", timezone=BERLIN, priority=0)
    high = WindowSpec(id=3, cron="30 0 * * *", until="01:30", timezone=BERLIN, priority=5)
    at = utc(2026, 1, 16, 1, 30)  # 02:30 Berlin: base and later hold it
    chosen = active_window([base, later, high], at)
    assert chosen is not None and chosen.schedule_id == 2
    at = utc(2026, 1, 16, 0, 15)  # 01:15 Berlin: base and high hold it
    chosen = active_window([base, later, high], at)
    assert chosen is not None and chosen.schedule_id == 3
    chosen = active_window([base, later, high], utc(2026, 1, 16, 3))  # 04:00 Berlin
    assert chosen is not None and chosen.schedule_id == 1
    assert active_window([base, later, high], utc(2026, 1, 16, 12)) is None


def test_seconds_field_for_short_windows() -> None:
    spec = WindowSpec(id=5, cron="0 12 * * *", until="12:00:08", timezone="UTC", cron_seconds="3")
    assert window_at(spec, utc(2026, 1, 1, 12, 0, 2)) is None
    window = window_at(spec, utc(2026, 1, 1, 12, 0, 5))
    assert window is not None and window.end == utc(2026, 1, 1, 12, 0, 8)


def test_frequent_cron_finds_the_latest_firing() -> None:
    spec = WindowSpec(id=6, cron="* * * * *", until="23:59:59", timezone="UTC", cron_seconds="*")
    window = window_at(spec, utc(2026, 1, 1, 10, 0, 30, 500))
    assert window is not None and window.start == utc(2026, 1, 1, 10, 0, 30)


@pytest.mark.parametrize(("cron", "zone"), [("0 25 * * *", "UTC"), ("0 1 * *", "UTC")])
def test_bad_cron_raises(cron: str, zone: str) -> None:
    with pytest.raises(ValueError):
        cron_trigger(cron, zone)


def test_bad_zone_raises() -> None:
    with pytest.raises(ValueError, match="time zone"):
        cron_trigger("0 1 * * *", "Mars/Olympus")
