"""The window logic as a pure function of (schedules, now), on given datetimes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from control.schedules.windows import (
    FiringCache,
    WindowSpec,
    active_window,
    check_fires,
    cron_trigger,
    firings_at,
    next_firings,
    window_at,
)

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


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 6 *", "0 0 31 4,6,9,11 *"])
def test_a_cron_that_never_fires_in_five_years_is_refused(cron: str) -> None:
    with pytest.raises(ValueError, match="never fires"):
        check_fires(cron, utc(2026, 12, 1))


def test_29_february_fires_every_four_years_and_stays_valid() -> None:
    check_fires("0 0 29 2 *", utc(2029, 3, 1))  # next: 2032
    spec = WindowSpec(id=7, cron="0 0 29 2 *", until="01:00", timezone="UTC")
    assert next_firings(spec, utc(2029, 3, 1), 1) == [utc(2032, 2, 29)]


def test_a_stored_cron_that_never_fires_costs_a_bounded_search() -> None:
    """Unbounded, APScheduler walked to the year 9999: 0.2-0.5 s a search, ~4.6 s for the
    latest firing. Every search now ends at now (or five years ahead)."""
    spec = WindowSpec(id=8, cron="0 0 30 2 *", until="01:00", timezone="UTC")
    started = time.perf_counter()
    firings = firings_at(spec, utc(2026, 12, 1))
    assert time.perf_counter() - started < 0.1
    assert (firings.last, firings.upcoming) == (None, None)
    assert next_firings(spec, utc(2026, 12, 1), 5) == []


def test_the_cache_searches_again_only_once_the_next_firing_passed() -> None:
    spec = WindowSpec(id=9, cron="0 1 * * *", until="05:00", timezone=BERLIN)
    cache = FiringCache()
    first = cache.firings(spec, utc(2026, 1, 15, 12))
    assert cache.firings(spec, utc(2026, 1, 15, 23, 59, 59)) is first  # 00:59:59 Berlin
    after = cache.firings(spec, utc(2026, 1, 16, 0, 0))  # 01:00 Berlin: it fired
    assert after is not first and after.last == utc(2026, 1, 16, 0, 0)
    assert cache.firings(spec, utc(2026, 1, 15, 12)) is not after  # the clock went back


def test_the_cache_answers_what_the_pure_function_answers() -> None:
    specs = [
        WindowSpec(id=1, cron="0 1 * * *", until="05:00", timezone=BERLIN),
        WindowSpec(id=2, cron="0 2 * * *", until="03:00", timezone=BERLIN),
        WindowSpec(id=3, cron="30 0 * * *", until="01:30", timezone=BERLIN, priority=5),
        WindowSpec(id=4, cron="0 0 30 2 *", until="01:00", timezone="UTC"),
    ]
    cache = FiringCache()
    moments = [utc(2026, 1, 15, 22) + timedelta(minutes=7 * i) for i in range(60)]
    for now in [*moments, *reversed(moments)]:
        assert cache.active_window(specs, now) == active_window(specs, now), now
        for spec in specs:
            upcoming = next_firings(spec, now, 1)
            assert cache.next_run(spec, now) == (upcoming[0] if upcoming else None)
