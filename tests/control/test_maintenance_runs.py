"""Maintenance without a model: every run recorded (bounded), failures recorded and counted,
rescheduling, and the on-time verdict."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import get_type_hints

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, SQLModel, func, select

from control import migrate
from control.core.db import make_engine
from control.jobs.maintenance import Maintenance
from control.metrics import ControlMetrics
from control.models import MaintenanceRun, ReclaimRunBase, utcnow
from control.schemas.state import ReclaimRun
from engine.kv_stats import ReclaimResult
from tests.control.support import wait_for


class StubEngine:
    """``reclaim()`` answers at once, or fails when ``error`` is set."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.calls = 0

    def reclaim(self) -> Future[ReclaimResult]:
        self.calls += 1
        future: Future[ReclaimResult] = Future()
        if self.error is not None:
            future.set_exception(self.error)
        else:
            future.set_result(ReclaimResult(2, 1, 10, 13, False, 0.001))
        return future


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Engine]:
    path = tmp_path / "maintenance.db"
    migrate.upgrade(path)
    engine = make_engine(path)
    yield engine
    engine.dispose()


def rows(db: Engine) -> int:
    with Session(db) as session:
        return session.exec(select(func.count()).select_from(MaintenanceRun)).one()


def sample(metrics: ControlMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_runs_are_recorded_with_bounded_retention(db: Engine) -> None:
    metrics = ControlMetrics()
    maintenance = Maintenance(StubEngine(), db, metrics, interval_s=3600, retention=10)  # type: ignore[arg-type]
    for _ in range(15):
        run = maintenance.run("manual")
    assert (run.freed, run.evicted, run.free_before, run.free_after) == (2, 1, 10, 13)
    assert rows(db) == 10
    with Session(db) as session:
        last = maintenance.last_runs(session, limit=3)
    assert len(last) == 3
    assert last[0].at >= last[1].at >= last[2].at
    assert last[0].at.tzinfo is not None
    assert sample(metrics, "servedeck_reclaimed_blocks_total") == 30
    assert sample(metrics, "servedeck_reclaim_runs_total", outcome="ok") == 15


def test_scheduled_failure_is_recorded_counted_and_the_job_keeps_running(db: Engine) -> None:
    engine = StubEngine()
    engine.error = RuntimeError("engine gone")
    metrics = ControlMetrics()
    maintenance = Maintenance(engine, db, metrics, interval_s=0.5)  # type: ignore[arg-type]
    maintenance.start()
    try:
        wait_for(lambda: sample(metrics, "servedeck_reclaim_runs_total", outcome="error") >= 2)
        with Session(db) as session:
            failed = maintenance.last_runs(session)[0]
        assert (failed.trigger, failed.outcome) == ("scheduled", "error")
        assert failed.error == "RuntimeError: engine gone"
        engine.error = None
        wait_for(lambda: sample(metrics, "servedeck_reclaim_runs_total", outcome="ok") >= 1)
        assert maintenance.on_time()
    finally:
        maintenance.shutdown()
    assert not maintenance.on_time()


def test_reschedule_changes_the_interval_and_next_run(db: Engine) -> None:
    maintenance = Maintenance(StubEngine(), db, ControlMetrics(), interval_s=3600)  # type: ignore[arg-type]
    maintenance.start()
    try:
        with Session(db) as session:
            before = maintenance.job(session)
            maintenance.reschedule(2.0)
            after = maintenance.job(session)
        assert (before.interval_s, after.interval_s) == (3600, 2.0)
        assert before.next_run_at is not None and after.next_run_at is not None
        assert (before.next_run_at - after.next_run_at).total_seconds() > 3000
        assert after.on_time
    finally:
        maintenance.shutdown()


def test_a_recorded_run_carries_the_engine_sweeps_figures_by_their_names() -> None:
    """The table and the API answer are one declaration (``ReclaimRunBase``) whose figures are
    the engine's ``ReclaimResult`` fields; a failed run has none of them."""
    figures = [f.name for f in dataclasses.fields(ReclaimResult)]
    recorded = list(ReclaimRunBase.model_fields)
    assert recorded == ["at", "trigger", "outcome", *figures, "error"]
    assert list(ReclaimRun.model_fields) == recorded
    columns = SQLModel.metadata.tables["maintenance_run"].columns
    assert [c.name for c in columns] == [*recorded, "id", "job_id"]
    for name, kind in get_type_hints(ReclaimResult).items():
        assert ReclaimRunBase.model_fields[name].annotation in (kind, kind | None), name
    result = ReclaimResult(2, 1, 10, 13, True, 0.001)
    run = ReclaimRun.of(result, utcnow(), "manual")
    assert [getattr(run, name) for name in figures] == list(dataclasses.astuple(result))


def test_a_run_reads_back_from_its_row_as_it_was_recorded(db: Engine) -> None:
    engine = StubEngine()
    maintenance = Maintenance(engine, db, ControlMetrics(), interval_s=3600)  # type: ignore[arg-type]
    ran = maintenance.run("manual")
    engine.error = TimeoutError("no answer")
    with pytest.raises(TimeoutError):
        maintenance.run("scheduled")
    with Session(db) as session:
        failed, recorded = maintenance.last_runs(session)
    assert recorded == ran
    assert (failed.outcome, failed.free_before, failed.free_after, failed.freed) == (
        "error",
        None,
        None,
        0,
    )
    assert failed.error == "TimeoutError: no answer"
