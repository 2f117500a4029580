"""Policy version states (pending -> applied | failed) through a real server, the migration
that adds them, and admin input that once answered 500."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic import command

from control import migrate
from tests.control.support import ADMIN, TOKEN, ServerProcess, sse_events, state, wait_for

SQLITE_INTEGER_MAX = 2**63 - 1


# -- the migration -----------------------------------------------------------------------------


def test_migration_0002_marks_stored_versions_applied(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    migrate.upgrade(db, "0001")
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO policy_version (version, policy_name, policy_params, memory_reserve, "
            "reclaim_interval_s, explicit, actor, reason, created_at) "
            "VALUES (1, 'continuous', '{}', 0.1, 5.0, '[]', 'servedeck', 'seed', "
            "'2026-11-29 10:00:00.000000')"
        )
    migrate.upgrade(db)
    command.check(migrate.alembic_config(db))  # models and migrations agree
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state, state_reason, state_at FROM policy_version").fetchone()
        assert row == ("applied", None, "2026-11-29 10:00:00.000000")
        with pytest.raises(sqlite3.IntegrityError, match="state"):  # no default left behind
            conn.execute(
                "INSERT INTO policy_version (version, policy_name, policy_params, "
                "memory_reserve, reclaim_interval_s, explicit, actor, reason, created_at) "
                "VALUES (2, 'static', '{}', 0.1, 5.0, '[]', 'x', 'y', '2026-11-29 10:00:01')"
            )
    migrate.downgrade(db, "0001")
    with sqlite3.connect(db) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(policy_version)")}
    assert "state" not in columns


# -- states through a real server --------------------------------------------------------------


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A change waits at most 1 s for the engine, then stays pending and is retried; a loop
    busy without progress for 1 s is stalled (how a test knows its injected stall began)."""
    proc = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("states-server"),
        ["--admin-token", TOKEN, "--policy-apply-timeout-s", "1", "--stall-timeout-s", "1"],
        {"SERVEDECK_TESTING": "1"},
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(headers=ADMIN) as client:
        yield client


def newest(http: httpx.Client) -> dict:
    return http.get("/admin/policy/history", params={"limit": 1}).json()["items"][0]


def test_seeded_and_changed_versions_are_applied(http: httpx.Client) -> None:
    assert http.get("/admin/policy").json()["status"]["state"] == "applied"
    response = http.put("/admin/policy", json={"memory_reserve": 0.2, "reason": "more room"})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["applied"] is True
    assert result["status"]["state"] == "applied"
    assert result["status"]["state_at"] is not None
    item = newest(http)
    assert (item["version"], item["status"]["state"]) == (result["version"], "applied")
    dry = http.put("/admin/policy", params={"dry_run": "true"}, json={"reason": "just looking"})
    assert dry.json()["status"] is None


def test_change_the_engine_cannot_take_in_time_is_200_pending_then_applied(
    http: httpx.Client, server: ServerProcess
) -> None:
    """A stalled engine loop cannot switch within the 1 s apply timeout: the stored change is
    answered 200 ``pending`` (not a failure), then the retry job puts it in force."""
    lines: list[str] = []

    def stream() -> None:
        body = {"prompt": "Once upon", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with server.client() as client, client.stream("POST", "/v1/completions", json=body) as r:
            lines.extend(r.iter_lines())

    reader = threading.Thread(target=stream)
    reader.start()
    wait_for(lambda: state(http)["queue"]["running"] == 1)
    assert http.post("/admin/testing/stall", params={"seconds": 5}).status_code == 200
    wait_for(lambda: http.get("/ready").json().get("reason") == "stalled", timeout=10)
    version = http.get("/admin/policy").json()["version"]

    response = http.put(
        "/admin/policy", json={"policy": {"name": "hybrid"}, "reason": "while stalled"}
    )
    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["version"], result["applied"]) == (version + 1, False)
    assert result["status"]["state"] == "pending"
    assert "retried" in result["status"]["state_reason"]
    view = http.get("/admin/policy").json()
    assert (view["version"], view["status"]["state"]) == (version + 1, "pending")
    assert newest(http)["status"]["state"] == "pending"

    wait_for(lambda: newest(http)["status"]["state"] == "applied", timeout=20)
    assert state(http)["scheduler"]["policy"] == "hybrid"
    assert state(http)["version"] == version + 1
    assert newest(http)["status"]["state_reason"] is None
    reader.join(30)
    events = sse_events(lines)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_stored_params_the_engine_refuses_at_start_up_are_failed_with_the_reason(
    http: httpx.Client, server: ServerProcess
) -> None:
    spec = {"name": "static", "params": {"max_batch_size": 16}}
    assert http.put("/admin/policy", json={"policy": spec, "reason": "batches"}).is_success
    server.restart(["--max-num-seqs", "8"])
    try:
        with server.client(headers=ADMIN) as after:
            status = after.get("/admin/policy").json()["status"]
            assert status["state"] == "failed"
            assert "do not fit this engine" in status["state_reason"]
            assert "max_batch_size" in status["state_reason"]
            assert newest(after)["status"] == status
    finally:
        server.restart()
    with server.client(headers=ADMIN) as again:  # fits again: in force at start-up
        assert again.get("/admin/policy").json()["status"]["state"] == "applied"


def test_version_left_pending_by_a_crash_is_put_in_force_at_start_up(
    http: httpx.Client, server: ServerProcess
) -> None:
    """Stored, then the process died before the engine took it: the next start applies it."""
    version = http.get("/admin/policy").json()["version"]
    server.stop()
    with sqlite3.connect(server.db) as db:
        db.execute(
            "INSERT INTO policy_version (version, policy_name, policy_params, memory_reserve, "
            "reclaim_interval_s, explicit, actor, reason, created_at, state) "
            "VALUES (?, 'dynamic', '{\"length_window\": 64}', 0.1, 5.0, '[\"policy.name\"]', "
            "'alice', 'before the crash', '2026-11-30 06:00:00', 'pending')",
            (version + 1,),
        )
    server.start()
    with server.client(headers=ADMIN) as after:
        view = after.get("/admin/policy").json()
        assert (view["version"], view["status"]["state"]) == (version + 1, "applied")
        snap = state(after)
        assert (snap["version"], snap["scheduler"]["policy"]) == (version + 1, "dynamic")
        assert snap["scheduler"]["params"]["length_window"] == 64


def test_rollback_answers_its_state(http: httpx.Client) -> None:
    response = http.post("/admin/policy/rollback/1", json={"reason": ""})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["status"]["state"] == "applied"
    assert newest(http)["reason"] == "rollback to version 1"


# -- admin input that answered 500 ------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "params", "loc"),
    [
        ("GET", "/admin/policy/history", {"offset": str(2**63)}, ["query", "offset"]),
        ("GET", "/admin/policy/history", {"offset": "-1"}, ["query", "offset"]),
        ("POST", "/admin/policy/rollback/999999999999999999999", {}, ["path", "version"]),
        ("POST", f"/admin/policy/rollback/{2**63}", {}, ["path", "version"]),
        ("POST", "/admin/policy/rollback/0", {}, ["path", "version"]),
    ],
)
def test_numbers_past_sqlite_integer_are_422_naming_the_field(
    client: httpx.Client, method: str, path: str, params: dict, loc: list
) -> None:
    response = client.request(method, path, params=params, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["detail"]] == [loc]


def test_largest_sqlite_integer_is_a_correct_answer(client: httpx.Client) -> None:
    offset = {"offset": str(SQLITE_INTEGER_MAX)}
    page = client.get("/admin/policy/history", params=offset, headers=ADMIN)
    assert page.status_code == 200
    assert page.json()["items"] == []
    missing = client.post(f"/admin/policy/rollback/{SQLITE_INTEGER_MAX}", headers=ADMIN)
    assert missing.status_code == 404
    assert str(SQLITE_INTEGER_MAX) in missing.json()["detail"]


@pytest.mark.parametrize("reason", ["", " \t\n"])
def test_blank_reason_is_refused_as_the_schema_says(client: httpx.Client, reason: str) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["PolicyUpdate"]
    assert schema["properties"]["reason"]["minLength"] == 1
    assert schema["properties"]["reason"]["pattern"] == r"\S"
    assert "reason" in schema["required"]
    response = client.put("/admin/policy", json={"reason": reason}, headers=ADMIN)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "reason"]
    assert "reason must not be empty" in error["msg"]


def test_every_admin_operation_declares_what_it_answers(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    declared = {
        (method.upper(), path): set(operation["responses"])
        for path, operations in paths.items()
        if path.startswith("/admin")
        for method, operation in operations.items()
    }
    assert len(declared) >= 10
    for operation, codes in declared.items():
        assert {"401", "403", "503"} <= codes, operation
        assert codes & {"200", "201", "202"}, operation  # its success (201: created, 202: started)
    assert {"404", "409", "422"} <= declared[("POST", "/admin/policy/rollback/{version}")]
    assert {"409", "422"} <= declared[("PUT", "/admin/policy")]
    assert "422" in declared[("GET", "/admin/policy/history")]
    error = paths["/admin/policy"]["get"]["responses"]["403"]["content"]["application/json"]
    assert error["schema"] == {"$ref": "#/components/schemas/AdminError"}


@pytest.mark.parametrize("method", ["OPTIONS", "POST", "DELETE"])
def test_other_methods_on_the_policy_are_405_naming_both(client: httpx.Client, method: str) -> None:
    response = client.request(method, "/admin/policy")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, PUT"


def test_policy_params_schema_is_per_policy_with_the_engine_caps(client: httpx.Client) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]

    def ref(schema: dict) -> dict:
        return schemas[schema["$ref"].rsplit("/", 1)[1]]

    union = schemas["PolicyUpdate"]["properties"]["policy"]["anyOf"][0]
    assert union["discriminator"]["propertyName"] == "name"
    branches = [ref(b) for b in union["oneOf"]]
    params = {b["properties"]["name"]["const"]: ref(b["properties"]["params"]) for b in branches}
    assert set(params) == {"static", "dynamic", "continuous", "hybrid"}
    assert all(p["additionalProperties"] is False for p in params.values())
    assert params["static"]["properties"]["max_batch_size"]["maximum"] == 256  # max_num_seqs
    tokens = params["continuous"]["properties"]["max_num_batched_tokens"]["anyOf"][0]
    assert tokens["maximum"] == 2048  # the server's max_num_batched_tokens
    over = {"policy": {"name": "static", "params": {"max_batch_size": 257}}, "reason": "x"}
    assert client.put("/admin/policy", json=over, headers=ADMIN).status_code == 422


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"max_batch_size": "16"}, "JSON type integer"),
        ({"max_batch_size": True}, "JSON type integer"),
        ({"max_wait_s": "30"}, "JSON type null or number"),
    ],
)
def test_policy_params_take_json_types_only(client: httpx.Client, params: dict, words: str) -> None:
    body = {"policy": {"name": "static", "params": params}, "reason": "types"}
    response = client.put("/admin/policy", json=body, params={"dry_run": "true"}, headers=ADMIN)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "policy", "params", next(iter(params))]
    assert words in error["msg"]


def test_integral_float_is_an_integer_param(client: httpx.Client) -> None:
    body = {"policy": {"name": "static", "params": {"max_batch_size": 16.0}}, "reason": "types"}
    response = client.put("/admin/policy", json=body, params={"dry_run": "true"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["settings"]["policy"]["params"] == {"max_batch_size": 16}
