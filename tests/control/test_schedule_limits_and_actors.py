"""Issue 23, defects 1 and 7, against one real server (``--max-schedules 3``):

- a cron that never fires within five years (30 February) is a 422 naming ``cron``; 29
  February is accepted; past ``max_schedules`` live schedules a create is a 422;
- a never-firing schedule stored before the check (written to the SQLite file directly) does not
  slow ``GET /admin/schedules`` (4-12 s before the bounded search, a few ms now);
- the server's own actor names cannot be claimed through ``X-Servedeck-Actor``, on any route
  that reads it;
- the guardrail's bounds refuse a policy allowed twice and a bounded knob no allowed policy has.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from control.core.db import make_engine
from control.models import Schedule
from tests.control.support import ADMIN, TOKEN, ServerProcess

MAX_SCHEDULES = 3


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    args = ["--admin-token", TOKEN, "--max-schedules", str(MAX_SCHEDULES)]
    process = ServerProcess(tiny_model_dir, tmp_path_factory.mktemp("limits"), args, {})
    process.start()
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client
        for item in client.get("/admin/schedules", headers=ADMIN).json()["items"]:
            client.delete(f"/admin/schedules/{item['id']}", headers=ADMIN)


def schedule(cron: str = "0 3 * * *") -> dict[str, Any]:
    body = {"cron": cron, "until": "04:00", "policy": {"name": "dynamic"}}
    return body | {"reason": "nightly batch"}


def locs(response: httpx.Response) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["detail"]]


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 6 *"])
def test_a_cron_that_never_fires_is_422_naming_cron(http: httpx.Client, cron: str) -> None:
    response = http.post("/admin/schedules", json=schedule(cron), headers=ADMIN)
    assert locs(response) == [["body", "cron"]]
    assert "never fires" in response.json()["detail"][0]["msg"]


def test_29_february_is_accepted(http: httpx.Client) -> None:
    response = http.post("/admin/schedules", json=schedule("0 0 29 2 *"), headers=ADMIN)
    assert response.status_code == 201, response.text
    assert response.json()["next_run_at"].endswith("-02-29T00:00:00Z")


def test_past_max_schedules_a_create_is_422_until_one_is_deleted(http: httpx.Client) -> None:
    made = [http.post("/admin/schedules", json=schedule(), headers=ADMIN) for _ in range(3)]
    assert [r.status_code for r in made] == [201] * MAX_SCHEDULES
    refused = http.post("/admin/schedules", json=schedule(), headers=ADMIN)
    assert locs(refused) == [["body"]]
    error = refused.json()["detail"][0]
    assert (error["type"], error["ctx"]) == ("too_many_schedules", {"max_schedules": 3})
    assert len(http.get("/admin/schedules", headers=ADMIN).json()["items"]) == MAX_SCHEDULES
    sid = made[0].json()["id"]
    assert http.delete(f"/admin/schedules/{sid}", headers=ADMIN).status_code == 200
    again = http.post("/admin/schedules", json=schedule(), headers=ADMIN)
    assert again.status_code == 201, again.text


def test_a_stored_schedule_that_never_fires_leaves_the_list_fast(
    server: ServerProcess, http: httpx.Client
) -> None:
    db = make_engine(server.db)
    with Session(db) as session:  # as stored before the check: the API refuses it now
        fields = {"cron": "0 0 30 2 *", "until": "01:00", "timezone": "UTC"}
        session.add(Schedule(**fields, policy_name="dynamic", reason="30 February", actor="ops"))
        session.commit()
    db.dispose()
    started = time.perf_counter()
    listed = http.get("/admin/schedules", headers=ADMIN)
    took = time.perf_counter() - started
    assert listed.status_code == 200, listed.text
    [item] = listed.json()["items"]
    assert (item["cron"], item["next_run_at"], item["active"]) == ("0 0 30 2 *", None, False)
    assert took < 1.0  # 4-12 s before
    detail = http.get(f"/admin/schedules/{item['id']}", headers=ADMIN).json()
    assert detail["next_firings"] == []


RESERVED = ["guardrail", "Guardrail", "servedeck", "schedule:1", "SCHEDULE:x"]


def actor_routes(http: httpx.Client) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every route that reads X-Servedeck-Actor, with a body it would accept."""
    policy = http.get("/admin/policy", headers=ADMIN).json()
    settings = {"policy": policy["settings"]["policy"], "reason": "try"}
    sid = http.post("/admin/schedules", json=schedule(), headers=ADMIN).json()["id"]
    guardrail = {"mode": "off", "reason": "try"}
    return [
        ("PUT", "/admin/policy", settings),
        ("PUT", "/admin/policy?dry_run=true", settings),
        ("POST", f"/admin/policy/rollback/{policy['version']}", {"reason": "try"}),
        ("POST", "/admin/schedules", schedule()),
        ("DELETE", f"/admin/schedules/{sid}?reason=try", None),
        ("PUT", "/admin/guardrail", guardrail),
    ]


def test_reserved_actors_cannot_be_claimed(http: httpx.Client) -> None:
    routes = actor_routes(http)
    before = http.get("/admin/policy", headers=ADMIN).json()["version"]
    for method, path, body in routes:
        for actor in RESERVED:
            headers = {**ADMIN, "X-Servedeck-Actor": actor}
            response = http.request(method, path, json=body, headers=headers)
            assert locs(response) == [["header", "x-servedeck-actor"]], (method, path, actor)
    assert http.get("/admin/policy", headers=ADMIN).json()["version"] == before
    assert len(http.get("/admin/schedules", headers=ADMIN).json()["items"]) == 1
    for method, path, body in routes:  # a person's name still works everywhere
        response = http.request(
            method, path, json=body, headers={**ADMIN, "X-Servedeck-Actor": "ops"}
        )
        assert response.status_code in (200, 201), (method, path, response.text)


@pytest.mark.parametrize(
    ("bounds", "field"),
    [
        ({"policies": ["static"], "max_num_seqs": {"min": 4, "max": 8}}, "max_num_seqs"),
        (
            {"policies": ["dynamic"], "single_request_below": {"min": 1, "max": 4}},
            "single_request_below",
        ),
        ({"policies": ["continuous", "hybrid", "continuous"]}, "policies"),
    ],
)
def test_contradictory_guardrail_bounds_are_422_naming_them(
    http: httpx.Client, bounds: dict[str, Any], field: str
) -> None:
    revision = http.get("/admin/guardrail", headers=ADMIN).json()["revision"]
    body = {"mode": "shadow", "bounds": bounds, "reason": "try"}
    response = http.put("/admin/guardrail", json=body, headers=ADMIN)
    assert locs(response) == [["body", "bounds", field]]
    assert http.get("/admin/guardrail", headers=ADMIN).json()["revision"] == revision


def test_bounds_of_a_knob_some_allowed_policy_has_are_accepted(http: httpx.Client) -> None:
    bounds = {"policies": ["static", "continuous"], "max_num_seqs": {"min": 4, "max": 8}}
    body = {"mode": "off", "bounds": bounds, "reason": "continuous has max_num_seqs"}
    response = http.put("/admin/guardrail", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
