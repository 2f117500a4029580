"""``GET /admin/jobs`` lists every job on the maintenance scheduler, the sweep first."""

from __future__ import annotations

from datetime import datetime

import httpx

from control.compose import RECONCILE_JOB_ID
from control.guardrail.service import JOB_ID as GUARDRAIL
from control.jobs.maintenance import JOB_ID as RECLAIM
from control.jobs.memory_trim import JOB_ID as MEMORY_TRIM
from control.jobs.watchdog import JOB_ID as WATCHDOG
from control.schedules.store import JOB_ID as SCHEDULES
from tests.control.support import ADMIN, wait_for


def test_every_job_is_listed_and_on_time(client: httpx.Client) -> None:
    def listed() -> list[dict] | None:
        jobs = client.get("/admin/jobs", headers=ADMIN).json()["jobs"]
        return jobs if all(job["on_time"] for job in jobs) else None

    jobs = wait_for(listed, timeout=10)
    assert [job["id"] for job in jobs] == [
        RECLAIM,
        RECONCILE_JOB_ID,
        SCHEDULES,
        GUARDRAIL,
        WATCHDOG,
        MEMORY_TRIM,
    ]
    for job in jobs:
        assert job["interval_s"] > 0
        assert datetime.fromisoformat(job["next_run_at"]).tzinfo is not None
    assert all(job["last_runs"] == [] for job in jobs[1:]), "only the sweep records its runs"
