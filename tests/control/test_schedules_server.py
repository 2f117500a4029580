"""Schedules against a real server: a window fired a few seconds ahead (``cron_seconds``
gives crontab the seconds field it lacks) stores and applies its version and restores the
previous setting at its end; a window that started while the server was down is applied at
start-up; a person's change during a window stands; schedules survive a restart."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.control.support import ADMIN, TOKEN, ServerProcess, set_settings, wait_for


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN], {})
    process.start()
    yield process
    process.stop()


def window(lead_s: float, length_s: float) -> tuple[datetime, dict[str, Any]]:
    """A schedule body whose one window starts ``lead_s`` from now (UTC) for ``length_s``."""
    start = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
    end = start + timedelta(seconds=length_s)
    return start, {
        "cron": f"{start.minute} {start.hour} * * *",
        "cron_seconds": str(start.second),
        "until": end.strftime("%H:%M:%S"),
        "timezone": "UTC",
        "policy": {"name": "dynamic", "params": {"length_window": 64}},
        "reason": "nightly offline batch",
    }


def policy(http: httpx.Client) -> dict[str, Any]:
    response = http.get("/admin/policy", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def create(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post(
        "/admin/schedules", json=body, headers={**ADMIN, "X-Servedeck-Actor": "ops"}
    )
    assert response.status_code == 201, response.text
    return response.json()


def sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


def window_metric(http: httpx.Client, sid: int) -> str | None:
    """The schedule's ``servedeck_schedule_window_active`` value, once a tick has set it."""
    found = re.search(
        rf'servedeck_schedule_window_active{{schedule="{sid}"}} ([0-9.]+)',
        http.get("/metrics").text,
    )
    return found.group(1) if found else None


def test_window_applies_then_restores_and_survives_restart(server: ServerProcess) -> None:
    with server.client() as http:
        before = policy(http)
        assert before["settings"]["policy"]["name"] == "continuous"
        start, body = window(4, 12)
        made = create(http, body)
        sid = made["id"]
        assert datetime.fromisoformat(made["next_run_at"]) == start
        assert made["actor"] == "ops" and not made["active"]

        def in_window() -> dict[str, Any] | None:
            """The version stored `pending`, then `applied` at a step; the list and the
            metric say the window is on (each read until it shows, all inside the window)."""
            p = policy(http)
            if p["settings"]["policy"]["name"] != "dynamic" or p["status"]["state"] != "applied":
                return None
            listed = http.get("/admin/schedules", headers=ADMIN).json()
            return p if listed["active"] == sid and window_metric(http, sid) == "1.0" else None

        applied = wait_for(in_window, 12)
        assert datetime.now(UTC) >= start
        assert applied["actor"] == f"schedule:{sid}"
        assert applied["settings"]["policy"]["params"] == {"length_window": 64}

        restored = wait_for(
            lambda: (
                (p := policy(http))["settings"]["policy"]["name"] == "continuous"
                and p["status"]["state"] == "applied"
                and p
            ),
            30,
        )
        assert restored["actor"] == f"schedule:{sid}"
        assert restored["version"] == applied["version"] + 1
        assert restored["settings"] == before["settings"]
        detail = http.get(f"/admin/schedules/{sid}", headers=ADMIN).json()
        assert detail["last_end"] == f"restored in version {restored['version']}"
        assert [c["action"] for c in detail["changes"]] == ["create"]
        assert detail["changes"][0]["actor"] == "ops"
        assert len(detail["next_firings"]) == 5

    server.restart()
    with server.client() as http:
        listed = http.get("/admin/schedules", headers=ADMIN).json()
        assert [s["id"] for s in listed["items"]] == [sid]
        # The restarted server's first tick has looked at the schedule: no window, so nothing
        # was applied (read after that tick, not after a guessed sleep).
        assert wait_for(lambda: window_metric(http, sid), 15) == "0.0"
        assert policy(http)["version"] == restored["version"]


def test_window_started_while_down_is_applied_at_start(server: ServerProcess) -> None:
    with server.client() as http:
        start, body = window(2, 600)  # ended by its deletion: as long as two starts take
        sid = create(http, body)["id"]
    server.stop()
    sleep_until(start + timedelta(seconds=1))
    server.start()
    with server.client() as http:
        applied = wait_for(lambda: (p := policy(http))["actor"] == f"schedule:{sid}" and p, 15)
        assert applied["settings"]["policy"]["name"] == "dynamic"
        version = applied["version"]
        server.restart()  # restart in the middle of the window: no second version
    with server.client() as http:
        # The restarted server's first tick saw the window in force (read after that tick,
        # not after a guessed sleep), and stored no second version for it.
        assert wait_for(lambda: window_metric(http, sid), 15) == "1.0"
        now = policy(http)
        assert (now["version"], now["settings"]["policy"]["name"]) == (version, "dynamic")
        response = http.delete(f"/admin/schedules/{sid}", headers=ADMIN, params={"reason": "done"})
        assert response.status_code == 200, response.text
        ended = wait_for(lambda: (p := policy(http))["version"] > version and p, 10)
        assert ended["settings"]["policy"]["name"] == "continuous"
        assert http.get(f"/admin/schedules/{sid}", headers=ADMIN).status_code == 404


def test_a_persons_change_during_the_window_stands(server: ServerProcess) -> None:
    with server.client() as http:
        start, body = window(2, 10)
        end = start + timedelta(seconds=10)
        sid = create(http, body)["id"]
        wait_for(lambda: policy(http)["actor"] == f"schedule:{sid}", 10)
        mine = set_settings(http, policy={"name": "hybrid"})
        assert datetime.now(UTC) < end, "the person's change came after the window"
        sleep_until(end + timedelta(seconds=3))
        now = policy(http)
        assert (now["version"], now["settings"]["policy"]["name"]) == (mine["version"], "hybrid")
        detail = http.get(f"/admin/schedules/{sid}", headers=ADMIN).json()
        assert detail["last_end"].startswith("kept: admin changed the setting")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cron", "0 25 * * *"),
        ("timezone", "Mars/Olympus"),
        ("until", "5pm"),
        ("cron_seconds", "61"),
    ],
)
def test_bad_schedule_is_422_naming_the_field(client: httpx.Client, field: str, value: str) -> None:
    _, body = window(60, 10)
    response = client.post("/admin/schedules", json=body | {field: value}, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["detail"]] == [["body", field]]


def test_params_over_the_engine_caps_are_422(client: httpx.Client) -> None:
    _, body = window(60, 10)
    body["policy"] = {"name": "dynamic", "params": {"max_batch_size": 10**6}}
    response = client.post("/admin/schedules", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:3] == ["body", "policy", "params"]


def test_schedules_need_the_admin_token(client: httpx.Client) -> None:
    assert client.get("/admin/schedules").status_code == 401


def test_a_window_equal_to_the_setting_in_force_stores_nothing(server: ServerProcess) -> None:
    with server.client() as http:
        mine = set_settings(http, policy={"name": "dynamic", "params": {"length_window": 64}})
        start, body = window(2, 4)
        sid = create(http, body)["id"]
        sleep_until(start + timedelta(seconds=1.5))
        assert http.get("/admin/schedules", headers=ADMIN).json()["active"] == sid
        sleep_until(start + timedelta(seconds=7))
        now = policy(http)
        assert (now["version"], now["actor"]) == (mine["version"], "admin")
