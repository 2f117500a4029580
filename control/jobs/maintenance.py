"""Scheduled maintenance: the KV reclaim sweep (job ``kv_reclaim``) on an APScheduler 3
``BackgroundScheduler``.

The job only asks the engine for a sweep (``EngineService.reclaim()``, run by the engine loop at a
step boundary: leaked blocks freed, then the memory-reserve guard) and waits for the answer.
Every run, scheduled or manual, is recorded in the database and in the metrics. The same
scheduler runs the runtime's small checker jobs (``add_job``: the policy reconcile, the stall
watchdog).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobEvent,
    JobExecutionEvent,
)
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine
from sqlmodel import Session, col, delete, select

from control.metrics import ControlMetrics
from control.models import MaintenanceRun, ReclaimTrigger, as_utc, utcnow
from control.schemas.state import JobView, ReclaimRun
from control.service.protocol import EngineService

log = logging.getLogger(__name__)

JOB_ID = "kv_reclaim"
RECLAIM_TIMEOUT_S = 30.0
ON_TIME_SLACK_S = 1.0
LAST_RUNS = 10


class Maintenance:
    def __init__(
        self,
        engine: EngineService,
        db: Engine,
        metrics: ControlMetrics,
        interval_s: float,
        retention: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._db = db
        self._metrics = metrics
        self.interval_s = interval_s
        self._retention = retention
        self._clock = clock
        self._scheduler = BackgroundScheduler(timezone=UTC)
        self._lock = threading.Lock()
        self._reference = clock()
        """When the job was (re)scheduled or last started on schedule: what "on time" is
        measured from."""
        self._intervals: dict[str, float] = {}
        """The ``add_job`` jobs' intervals, in the order they were added."""
        self._started: dict[str, float] = {}
        """When each ``add_job`` job was added or last started (its "on time" reference)."""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._scheduler.add_listener(
            self._on_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES
        )
        self._scheduler.add_job(
            self._scheduled_run,
            IntervalTrigger(seconds=self.interval_s),
            id=JOB_ID,
            name="KV reclaim sweep",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(self.interval_s)),
            replace_existing=True,
        )
        self._scheduler.start()
        self._reference = self._clock()

    def add_job(self, job_id: str, name: str, func: Callable[[], None], interval_s: float) -> None:
        """A light periodic job beside the sweep: one run at a time, missed runs coalesced.
        It is listed by ``jobs`` (``GET /admin/jobs``) with the time it last started."""

        def run() -> None:
            self._started[job_id] = self._clock()
            func()

        self._intervals[job_id] = interval_s
        self._started[job_id] = self._clock()
        self._scheduler.add_job(
            run,
            IntervalTrigger(seconds=interval_s),
            id=job_id,
            name=name,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(interval_s)),
            replace_existing=True,
        )

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)

    def reschedule(self, interval_s: float) -> None:
        with self._lock:
            if interval_s == self.interval_s:
                return
            self.interval_s = interval_s
            self._reference = self._clock()
            if self._scheduler.get_job(JOB_ID) is not None:
                self._scheduler.modify_job(JOB_ID, misfire_grace_time=max(1, int(interval_s)))
                self._scheduler.reschedule_job(JOB_ID, trigger=IntervalTrigger(seconds=interval_s))
        log.info("reclaim sweep rescheduled: every %.1f s", interval_s)

    # -- runs ------------------------------------------------------------------------------

    def _scheduled_run(self) -> None:
        self.run("scheduled")

    def run(self, trigger: ReclaimTrigger) -> ReclaimRun:
        """One sweep; an engine failure is recorded and raised."""
        at = utcnow()
        started = self._clock()
        if trigger == "scheduled":
            self._reference = started
        try:
            result = self._engine.reclaim().result(RECLAIM_TIMEOUT_S)
        except Exception as exc:
            self._record(ReclaimRun.failed(at, trigger, self._clock() - started, exc))
            raise
        run = ReclaimRun.of(result, at, trigger)
        self._record(run)
        if run.freed or run.evicted or run.reserve_breached:
            log.info(
                "reclaim (%s): freed %d, evicted %d, free %d -> %d%s",
                trigger,
                run.freed,
                run.evicted,
                run.free_before,
                run.free_after,
                ", reserve breached" if run.reserve_breached else "",
            )
        return run

    def _record(self, run: ReclaimRun) -> None:
        self._metrics.count_reclaim(run.outcome, run.freed, run.evicted)
        try:
            with Session(self._db) as session:
                row = MaintenanceRun.model_validate(run, update={"job_id": JOB_ID})
                session.add(row)
                session.commit()
                assert row.id is not None
                session.exec(
                    delete(MaintenanceRun).where(col(MaintenanceRun.id) <= row.id - self._retention)
                )
                session.commit()
        except Exception:
            log.exception("could not record a maintenance run")

    def _on_event(self, event: JobEvent) -> None:
        if event.job_id != JOB_ID:
            if event.code == EVENT_JOB_ERROR:
                assert isinstance(event, JobExecutionEvent)
                log.error("job %s failed: %r", event.job_id, event.exception)
            return
        if event.code == EVENT_JOB_ERROR:
            assert isinstance(event, JobExecutionEvent)
            log.error("reclaim sweep failed: %r", event.exception)
        elif event.code == EVENT_JOB_MISSED:
            self._metrics.count_reclaim("missed")
            log.warning("reclaim sweep missed its run time %s", event.scheduled_run_time)
        elif event.code == EVENT_JOB_MAX_INSTANCES:
            self._metrics.count_reclaim("skipped")
            log.warning("reclaim sweep skipped: the previous one is still running")

    # -- inspection ------------------------------------------------------------------------

    def on_time(self) -> bool:
        """The job is scheduled and started on schedule within the last two intervals."""
        if not self._scheduler.running or self._scheduler.get_job(JOB_ID) is None:
            return False
        return self._clock() - self._reference <= 2 * self.interval_s + ON_TIME_SLACK_S

    def last_runs(self, session: Session, limit: int = LAST_RUNS) -> list[ReclaimRun]:
        rows = session.exec(
            select(MaintenanceRun)
            .where(MaintenanceRun.job_id == JOB_ID)
            .order_by(col(MaintenanceRun.id).desc())
            .limit(limit)
        ).all()
        return [
            ReclaimRun.model_validate(
                row.model_dump(exclude={"id", "job_id"}) | {"at": as_utc(row.at)}
            )
            for row in rows
        ]

    def jobs(self, session: Session) -> list[JobView]:
        """Every job on the scheduler: the sweep first (with its recorded runs), then the
        ``add_job`` jobs in the order they were added (their runs are not recorded)."""
        views = [self.job(session)]
        running = self._scheduler.running
        for job_id, interval_s in self._intervals.items():
            job = self._scheduler.get_job(job_id)
            late = self._clock() - self._started[job_id] > 2 * interval_s + ON_TIME_SLACK_S
            views.append(
                JobView(
                    id=job_id,
                    interval_s=interval_s,
                    next_run_at=job.next_run_time if job is not None else None,
                    on_time=running and job is not None and not late,
                    last_runs=[],
                )
            )
        return views

    def job(self, session: Session) -> JobView:
        job = self._scheduler.get_job(JOB_ID)
        next_run = job.next_run_time if job is not None else None
        return JobView(
            id=JOB_ID,
            interval_s=self.interval_s,
            next_run_at=next_run,
            on_time=self.on_time(),
            last_runs=self.last_runs(session),
        )
