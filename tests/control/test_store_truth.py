"""A store write the database refuses (a full disk, a locked file, a failed state write) is
answered with the truth: 503 naming the cause, with ``stored`` and the state as they are; a
version not stored changes nothing in the engine, one stored is recorded by the reconcile job
(after a restart too). Time zones ``ZoneInfo`` cannot read are 422 naming the field. The disk is
made full for real with SQLite's ``max_page_count`` (``POST /admin/testing/store-full``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from control.core.db import make_engine
from tests.control.support import ADMIN, TOKEN, ServerProcess, state, wait_for

FULL = "store unavailable: database or disk is full"


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("store-truth"),
        ["--admin-token", TOKEN, "--policy-apply-timeout-s", "1"],
        {"SERVEDECK_TESTING": "1"},
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(headers=ADMIN) as client:
        yield client


def newest(http: httpx.Client) -> dict[str, Any]:
    return http.get("/admin/policy/history", params={"limit": 1}).json()["items"][0]


def engine_runs(http: httpx.Client) -> tuple[int, str, float]:
    snap = state(http)
    return snap["version"], snap["scheduler"]["policy"], snap["memory_reserve"]


def schedule(reason: str = "nights", **fields: Any) -> dict[str, Any]:
    body = {"cron": "0 3 * * *", "until": "04:00", "policy": {"name": "static"}}
    return body | {"reason": reason} | fields


def guardrail(reason: str) -> dict[str, Any]:
    return {
        "mode": "off",
        "objectives": {"ttft_p99_s": 1.0},
        "bounds": {"policies": ["continuous"], "max_num_batched_tokens": {"min": 16, "max": 64}},
        "reason": reason,
    }


# -- time zones ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "x" * 300,  # ENAMETOOLONG from the file system
        "x" * 255,
        "America",  # a folder: IsADirectoryError
        "zone.tab",  # a file of the zone database that is no zone
        "/etc/localtime",  # an absolute path
        "../UTC",
        "Europe/Berlin/",
        "a\u0000b",
    ],
)
def test_a_timezone_zoneinfo_cannot_read_is_422_naming_timezone(
    http: httpx.Client, name: str
) -> None:
    response = http.post("/admin/schedules", json=schedule(timezone=name))
    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["detail"]] == [["body", "timezone"]]


def test_the_timezone_length_is_in_the_schema(http: httpx.Client) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["ScheduleCreate"]["properties"]["timezone"]["maxLength"] == 255


# -- a version stored whose state cannot be written ---------------------------------------------


def test_a_version_stored_whose_state_write_fails_is_503_stored_pending_and_reconciled(
    http: httpx.Client, server: ServerProcess
) -> None:
    """The state write is refused by the database (a trigger aborts it) after the version was
    stored and the engine took it: 503 says so, the engine runs it, a restart keeps it in force
    and serving, and once the state can be written the reconcile job records ``applied``."""
    version = newest(http)["version"]
    with sqlite3.connect(server.db, isolation_level=None) as db:
        db.execute(
            "CREATE TRIGGER refuse_state BEFORE UPDATE OF state ON policy_version "
            "WHEN NEW.state = 'applied' BEGIN SELECT RAISE(ABORT, 'state write refused'); END"
        )
    response = http.put("/admin/policy", json={"policy": {"name": "hybrid"}, "reason": "x"})
    assert response.status_code == 503, response.text
    body = response.json()
    assert (body["stored"], body["version"], body["state"]) == (True, version + 1, "pending")
    assert body["in_force"] is True
    assert body["detail"].startswith("store unavailable: state write refused: ")
    assert f"version {version + 1} is stored" in body["detail"]
    assert newest(http)["status"]["state"] == "pending"
    assert engine_runs(http)[:2] == (version + 1, "hybrid")

    server.restart()  # the start-up's state write is refused too: it serves all the same
    with server.client(headers=ADMIN) as after:
        assert engine_runs(after)[:2] == (version + 1, "hybrid")
        assert newest(after)["status"]["state"] == "pending"
        with sqlite3.connect(server.db, isolation_level=None) as db:
            db.execute("DROP TRIGGER refuse_state")
        wait_for(lambda: newest(after)["status"]["state"] == "applied", timeout=10)
        assert newest(after)["version"] == version + 1


# -- writes the database refuses: nothing stored, nothing changed -------------------------------


def test_a_locked_database_stores_nothing_and_changes_nothing(
    http: httpx.Client, server: ServerProcess
) -> None:
    """Another writer holds the database past the busy timeout (5 s)."""
    before, running = newest(http), engine_runs(http)
    lock = sqlite3.connect(server.db, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        response = http.put("/admin/policy", json={"policy": {"name": "static"}, "reason": "x"})
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["detail"] == "store unavailable: database is locked: nothing was stored"
    assert (body["stored"], body["version"], body["state"]) == (False, None, None)
    assert newest(http) == before
    assert engine_runs(http) == running


def test_a_full_disk_is_503_on_policy_schedule_and_guardrail_writes_and_serving_goes_on(
    http: httpx.Client, server: ServerProcess
) -> None:
    before, running = newest(http), engine_runs(http)
    schedules = http.get("/admin/schedules").json()["items"]
    revision = http.get("/admin/guardrail").json()["revision"]
    pages = http.post("/admin/testing/store-full").json()
    assert pages["max_page_count"] == pages["page_count"]
    # longer than the free pages hold: the write needs a new page (overflow pages)
    big = "x" * ((pages["freelist_count"] + 2) * pages["page_size"])
    try:
        response = http.put("/admin/policy", json={"memory_reserve": 0.25, "reason": big})
        assert response.status_code == 503, response.text
        assert response.json()["detail"] == f"{FULL}: nothing was stored"
        assert response.json()["stored"] is False
        assert response.headers["retry-after"] == "5"
        rollback = http.post("/admin/policy/rollback/1", json={"reason": big})
        assert rollback.status_code == 503, rollback.text
        assert rollback.json()["stored"] is False

        created = http.post("/admin/schedules", json=schedule(reason=big))
        assert created.status_code == 503, created.text
        assert created.json() == {"detail": FULL}
        guard = http.put("/admin/guardrail", json=guardrail(big))
        assert guard.status_code == 503, guard.text
        assert guard.json() == {"detail": FULL}

        body = {"prompt": "Once upon", "max_tokens": 4}
        with server.client() as public:
            assert public.post("/v1/completions", json=body).status_code == 200
        assert http.get("/ready").status_code == 200
        assert newest(http) == before
        assert engine_runs(http) == running
        assert http.get("/admin/schedules").json()["items"] == schedules
        assert http.get("/admin/guardrail").json()["revision"] == revision
    finally:
        assert http.delete("/admin/testing/store-full").json()["max_page_count"] is None
    response = http.put("/admin/policy", json={"memory_reserve": 0.25, "reason": big})
    assert response.status_code == 200, response.text
    assert (response.json()["version"], engine_runs(http)[2]) == (before["version"] + 1, 0.25)
    assert http.post("/admin/schedules", json=schedule(reason=big)).status_code == 201
    assert http.put("/admin/guardrail", json=guardrail(big)).json()["revision"] == revision + 1


# -- the pool -----------------------------------------------------------------------------------


def test_a_connection_refused_as_read_only_is_dropped_from_the_pool(tmp_path: Path) -> None:
    """SQLite keeps a connection opened while the file was read-only read-only for good (the
    issue's "read-only, then writable again"); here the first connection is made read-only."""
    db = make_engine(tmp_path / "store.db")
    with db.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
    db.dispose()
    opened: list[int] = []

    @event.listens_for(db, "connect")
    def first_read_only(dbapi_connection: Any, _record: Any) -> None:
        opened.append(1)
        if len(opened) == 1:
            dbapi_connection.execute("PRAGMA query_only=1")

    with pytest.raises(OperationalError, match="readonly"), db.begin() as connection:
        connection.execute(text("INSERT INTO t VALUES (1)"))
    with db.begin() as connection:
        connection.execute(text("INSERT INTO t VALUES (2)"))
        assert connection.execute(text("SELECT x FROM t")).scalars().all() == [2]
    assert len(opened) == 2
