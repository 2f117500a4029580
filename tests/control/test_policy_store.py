"""The policy store through the admin API of a server of its own (restarted on the same
database): versions, sources, If-Match, dry run, validation, rollback and persistence."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.support import ADMIN, TOKEN, ServerProcess, state

DEFAULTS = {
    "policy": {"name": "continuous", "params": {}},
    "queue": {"name": "fcfs"},
    "memory_reserve": 0.1,
    "reclaim_interval_s": 5.0,
}


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Token from the environment; no SERVEDECK_TESTING, so no test-only routes."""
    proc = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("policy-server"),
        [],
        {"SERVEDECK_ADMIN_TOKEN": TOKEN},
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(headers=ADMIN) as client:
        yield client


def stored_versions(server: ServerProcess) -> list[tuple]:
    with sqlite3.connect(server.db) as db:
        return db.execute(
            "SELECT version, policy_name, policy_params, memory_reserve, reclaim_interval_s, "
            "actor, reason, rollback_of FROM policy_version ORDER BY version"
        ).fetchall()


def put(http: httpx.Client, body: dict, if_match: str | None = None, **params) -> httpx.Response:
    headers = {"If-Match": if_match} if if_match is not None else {}
    return http.put("/admin/policy", json=body, headers=headers, params=params)


def metric(http: httpx.Client, sample: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in /metrics")


def test_version_one_is_seeded_from_the_defaults(http: httpx.Client, server: ServerProcess) -> None:
    response = http.get("/admin/policy")
    assert response.headers["etag"] == '"1"'
    view = response.json()
    assert view["version"] == 1
    assert view["settings"] == DEFAULTS
    assert set(view["sources"].values()) == {"default"}
    assert view["effective_params"]["max_num_seqs"] == 256  # null default = the engine cap
    assert len(stored_versions(server)) == 1


def test_schema_lists_every_policy_with_bounds(http: httpx.Client) -> None:
    schema = http.get("/admin/policy/schema").json()
    assert set(schema["policies"]) == {"static", "dynamic", "continuous", "hybrid"}
    window = schema["policies"]["dynamic"]["properties"]["length_window"]
    assert (window["minimum"], window["default"]) == (1, 128)
    assert schema["memory_reserve"] == {"minimum": 0.0, "maximum": 0.5}
    assert schema["reclaim_interval_s"] == {"minimum": 0.5, "maximum": 3600}
    assert schema["engine_limits"]["num_kv_blocks"] == 128


def test_dry_run_returns_the_diff_and_stores_nothing(
    http: httpx.Client, server: ServerProcess
) -> None:
    before = stored_versions(server)
    body = {"policy": {"name": "dynamic", "params": {"max_batch_size": 16}}, "reason": "try"}
    response = put(http, body, dry_run="true")
    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["dry_run"], result["applied"], result["version"]) == (True, False, 1)
    assert {"field": "policy.name", "before": "continuous", "after": "dynamic"} in result["diff"]
    assert stored_versions(server) == before
    assert http.get("/admin/policy/history").json()["total"] == 1
    assert state(http)["policy"]["name"] == "continuous"


def test_change_is_stored_as_a_new_version_and_applied(
    http: httpx.Client, server: ServerProcess
) -> None:
    body = {
        "policy": {"name": "dynamic", "params": {"max_batch_size": 16}},
        "reclaim_interval_s": 2.0,
        "reason": "burst traffic",
    }
    response = http.put(
        "/admin/policy", json=body, headers={"If-Match": '"1"', "X-Servedeck-Actor": "alice"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["etag"] == '"2"'
    result = response.json()
    assert (result["dry_run"], result["applied"], result["version"]) == (False, True, 2)
    assert [c["field"] for c in result["diff"]] == [
        "policy.name",
        "policy.params.max_batch_size",
        "reclaim_interval_s",
    ]
    view = http.get("/admin/policy").json()
    assert view["sources"]["policy.name"] == "stored"
    assert view["sources"]["policy.params.max_batch_size"] == "stored"
    assert view["sources"]["policy.params.length_window"] == "default"
    assert view["sources"]["memory_reserve"] == "default"
    assert view["effective_params"] == {
        "max_batch_size": 16,
        "length_window": 128,
        "max_wait_s": None,
    }
    snap = state(http)
    assert snap["version"] == 2
    assert snap["scheduler"]["policy"] == "dynamic"
    assert http.get("/admin/jobs").json()["jobs"][0]["interval_s"] == 2.0
    assert stored_versions(server)[-1][:2] == (2, "dynamic")
    newest = http.get("/admin/policy/history").json()["items"][0]
    assert (newest["actor"], newest["reason"]) == ("alice", "burst traffic")
    assert newest["before"] == DEFAULTS


def test_stale_if_match_is_409_naming_both_versions(http: httpx.Client) -> None:
    conflicts = metric(http, 'servedeck_policy_updates_total{result="conflict"}')
    response = put(http, {"memory_reserve": 0.2, "reason": "late"}, if_match="1")
    assert response.status_code == 409
    assert response.json()["detail"] == "version is 2, not 1: reload and retry"
    assert metric(http, 'servedeck_policy_updates_total{result="conflict"}') == conflicts + 1


def test_bad_values_are_422_naming_every_failing_field(
    http: httpx.Client, server: ServerProcess
) -> None:
    stored = stored_versions(server)
    invalid = metric(http, 'servedeck_policy_updates_total{result="invalid"}')
    body = {
        "policy": {"name": "dynamic", "params": {"max_batch_size": 0, "length_window": "wide"}},
        "memory_reserve": 0.9,
        "reason": " ",
    }
    response = put(http, body)
    assert response.status_code == 422
    errors = {tuple(e["loc"]): e["msg"] for e in response.json()["detail"]}
    assert set(errors) == {
        ("body", "memory_reserve"),
        ("body", "reason"),
        ("body", "policy", "params", "max_batch_size"),
        ("body", "policy", "params", "length_window"),
    }
    assert "0.5" in errors[("body", "memory_reserve")]
    assert "reason must not be empty" in errors[("body", "reason")]
    assert stored_versions(server) == stored
    assert metric(http, 'servedeck_policy_updates_total{result="invalid"}') == invalid + 1


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        (
            {"policy": {"name": "static", "params": {"max_batch_size": 1000}}, "reason": "x"},
            ["body", "policy", "params", "max_batch_size"],
            "max_num_seqs=256",
        ),
        (
            {"policy": {"name": "static", "params": {"window": 3}}, "reason": "x"},
            ["body", "policy", "params", "window"],
            "Extra inputs",
        ),
        ({"policy": {"name": "fifo"}, "reason": "x"}, ["body", "policy", "name"], "static"),
        ({"memory_reserve": 0.2}, ["body", "reason"], "Field required"),
        ({"reclaim_interval_s": 0.1, "reason": "x"}, ["body", "reclaim_interval_s"], "0.5"),
        ({"memory_reserve": 0.2, "reason": "x", "typo": 1}, ["body", "typo"], "Extra inputs"),
    ],
)
def test_each_bad_field_is_named(http: httpx.Client, body: dict, loc: list, words: str) -> None:
    response = put(http, body)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == loc
    assert words in error["msg"]


def test_malformed_if_match_is_422(http: httpx.Client) -> None:
    response = put(http, {"memory_reserve": 0.2, "reason": "x"}, if_match="latest")
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["header", "if-match"]


def test_rollback_stores_a_new_version_copying_the_old_one(
    http: httpx.Client, server: ServerProcess
) -> None:
    assert http.post("/admin/policy/rollback/1", headers={"If-Match": "1"}).status_code == 409
    missing = http.post("/admin/policy/rollback/99", json={"reason": "x"})
    assert missing.status_code == 404
    assert "99" in missing.json()["detail"]

    response = http.post(
        "/admin/policy/rollback/1", json={"reason": "back to defaults"}, headers={"If-Match": "2"}
    )
    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["version"], result["settings"]) == (3, DEFAULTS)
    newest = http.get("/admin/policy/history", params={"limit": 1}).json()["items"][0]
    assert (newest["version"], newest["rollback_of"], newest["reason"]) == (
        3,
        1,
        "back to defaults",
    )
    assert newest["before"]["policy"]["name"] == "dynamic"
    assert state(http)["scheduler"]["policy"] == "continuous"
    assert http.get("/admin/jobs").json()["jobs"][0]["interval_s"] == 5.0
    assert [row[0] for row in stored_versions(server)] == [1, 2, 3]
    assert stored_versions(server)[-1][-1] == 1


def test_history_is_paginated_newest_first(http: httpx.Client) -> None:
    page = http.get("/admin/policy/history", params={"offset": 1, "limit": 1}).json()
    assert (page["total"], page["offset"], page["limit"]) == (3, 1, 1)
    assert [item["version"] for item in page["items"]] == [2]


def test_change_survives_a_restart_with_history_intact(
    http: httpx.Client, server: ServerProcess
) -> None:
    spec = {"name": "hybrid", "params": {"single_request_below": 2, "length_window": 64}}
    assert put(http, {"policy": spec, "memory_reserve": 0.2, "reason": "before restart"}).is_success
    history = http.get("/admin/policy/history").json()
    assert history["total"] == 4

    server.restart(["--reclaim-interval-s", "7"])

    with server.client(headers=ADMIN) as after:
        view = after.get("/admin/policy").json()
        assert view["version"] == 4
        assert view["settings"] == {
            "policy": spec,
            "queue": {"name": "fcfs"},
            "memory_reserve": 0.2,
            "reclaim_interval_s": 7.0,
        }
        assert view["sources"]["memory_reserve"] == "stored"
        assert view["sources"]["reclaim_interval_s"] == "override"
        assert after.get("/admin/policy/history").json() == history
        snap = state(after)
        assert (snap["scheduler"]["policy"], snap["memory_reserve"]) == ("hybrid", 0.2)
        assert snap["scheduler"]["params"]["single_request_below"] == 2
        assert after.get("/admin/jobs").json()["jobs"][0]["interval_s"] == 7.0
        assert after.get("/health").json()["version"] == 4

        # The next change stores what is in force, the override included, and replaces it.
        result = put(after, {"memory_reserve": 0.3, "reason": "after restart"}, if_match='"4"')
        assert result.json()["settings"]["reclaim_interval_s"] == 7.0
        view = after.get("/admin/policy").json()
        assert (view["version"], view["sources"]["reclaim_interval_s"]) == (5, "stored")


def test_test_only_routes_are_absent_without_testing_env(http: httpx.Client) -> None:
    assert http.post("/admin/testing/leak/anything").status_code == 404
