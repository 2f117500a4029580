"""The schedule job on given times: real SQLite (migrated), the real policy store; the engine
side of applying a version is recorded here (the server tests drive the real engine)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import Session

from control import migrate
from control.core.db import make_engine
from control.metrics import ControlMetrics
from control.policy.rows import seed
from control.policy.schemas import PolicySettings, PolicyUpdate
from control.policy.store import PolicyStore
from control.schedules.schemas import ScheduleCreate
from control.schedules.store import Schedules
from engine.config import EngineLimits

LIMITS = EngineLimits(16, 128, 512, 64, 2048)


class World:
    def __init__(self, path: Path) -> None:
        migrate.upgrade(path)
        self.db = make_engine(path)
        with Session(self.db) as session:
            seed(session)
        self.applied: list[tuple[int, str]] = []
        self.metrics = ControlMetrics()
        self.store = PolicyStore(LIMITS, self.apply, self.metrics)
        self.now = datetime(2026, 1, 15, 12, tzinfo=UTC)
        self.schedules = Schedules(self.db, self.store, self.metrics, lambda: self.now)

    def apply(self, settings: PolicySettings, version: int, timeout: float | None = None) -> None:
        self.applied.append((version, settings.policy.name))

    def add(self, cron: str, until: str, name: str, priority: int = 0) -> int:
        body = ScheduleCreate(
            cron=cron,
            until=until,
            timezone="Europe/Berlin",
            policy={"name": name},  # type: ignore[arg-type]
            reason=f"{name} window",
            priority=priority,
        )
        with Session(self.db) as session:
            return self.schedules.create(session, body, "ops").id

    def at(self, *when: int) -> tuple[int, str, str]:
        """Tick at ``when`` (UTC); the newest version, its policy and actor."""
        self.now = datetime(*when, tzinfo=UTC)  # type: ignore[misc]
        self.schedules.tick()
        with Session(self.db) as session:
            row = self.store.newest(session)
            return row.version, row.policy_name, row.actor


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "db.sqlite")


def test_overlapping_windows_then_restore(world: World) -> None:
    night = world.add("0 1 * * *", "05:00", "dynamic")  # 00:00-04:00 UTC in winter
    peak = world.add("0 2 * * *", "03:00", "hybrid", priority=5)  # 01:00-02:00 UTC
    assert world.at(2026, 1, 15, 23, 30) == (1, "continuous", "servedeck")
    assert world.at(2026, 1, 16, 0, 0, 1) == (2, "dynamic", f"schedule:{night}")
    assert world.at(2026, 1, 16, 0, 30) == (2, "dynamic", f"schedule:{night}")  # no repeat
    assert world.at(2026, 1, 16, 1, 0, 1) == (3, "hybrid", f"schedule:{peak}")
    assert world.at(2026, 1, 16, 2, 0, 1) == (4, "dynamic", f"schedule:{night}")
    assert world.at(2026, 1, 16, 4, 0, 1) == (5, "continuous", f"schedule:{night}")
    assert world.at(2026, 1, 16, 5) == (5, "continuous", f"schedule:{night}")
    assert [name for _, name in world.applied] == ["dynamic", "hybrid", "dynamic", "continuous"]
    with Session(world.db) as session:
        detail = world.schedules.get(session, night)
    assert detail.last_end == "restored in version 5"
    assert world.metrics.schedule_window_active.labels(str(night))._value.get() == 0


def test_a_persons_change_stands_at_the_end(world: World) -> None:
    night = world.add("0 1 * * *", "05:00", "dynamic")
    assert world.at(2026, 1, 16, 0, 0, 1)[:2] == (2, "dynamic")
    assert world.metrics.schedule_window_active.labels(str(night))._value.get() == 1
    with Session(world.db) as session:
        world.store.update(session, PolicyUpdate(policy={"name": "hybrid"}, reason="me"), "alice")  # type: ignore[arg-type]
    assert world.at(2026, 1, 16, 4, 0, 1) == (3, "hybrid", "alice")
    with Session(world.db) as session:
        assert world.schedules.get(session, night).last_end == (
            "kept: alice changed the setting (version 3)"
        )


def test_spring_forward_night_ends_an_hour_earlier_in_utc(world: World) -> None:
    world.add("0 1 * * *", "05:00", "dynamic")
    assert world.at(2026, 3, 29, 0, 0, 1)[1] == "dynamic"  # 01:00 CET
    assert world.at(2026, 3, 29, 2, 59)[1] == "dynamic"
    assert world.at(2026, 3, 29, 3, 0, 1)[1] == "continuous"  # 05:00 CEST
