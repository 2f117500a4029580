"""Stored data stays readable (issue 24): a database written by the code before the typed
policy spec (commit 365f413; how it was made: tests/control/fixtures/policy_db_365f413/README.md)
opens with today's code, migrated to the head: its history reads as the old code answered it
(each version with the queue it had, fcfs), every version applies again, its schedules and its
guardrail config read unchanged, and every YAML file ``servedeck policy get`` printed then
applies unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from control import migrate
from tests.control.support import ADMIN, TOKEN, ServerProcess

FIXTURE = Path(__file__).parent / "fixtures" / "policy_db_365f413"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
FCFS = {"name": "fcfs"}
SCHEDULE_FIELDS = ("id", "cron", "cron_seconds", "until", "timezone", "policy", "reason")


def with_queue(settings: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if settings is None else {**settings, "queue": FCFS}


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("old-db")
    server = ServerProcess(tiny_model_dir, workdir, ["--admin-token", TOKEN], {})
    shutil.copy(FIXTURE / "servedeck.db", server.db)
    assert migrate.current_revision(server.db) == "0004"
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(headers=ADMIN) as client:
        yield client


def test_the_old_database_migrates_and_its_history_reads_as_it_did(
    server: ServerProcess, http: httpx.Client
) -> None:
    assert migrate.current_revision(server.db) == migrate.head_revision()
    history = http.get("/admin/policy/history", params={"limit": 200}).json()
    old = EXPECTED["history"]
    assert history["total"] == old["total"] == 7
    for item, was in zip(history["items"], old["items"], strict=True):
        assert item["settings"] == item["after"] == with_queue(was["settings"]), item["version"]
        assert item["before"] == with_queue(was["before"])
        for field in ("version", "actor", "reason", "rollback_of", "status", "created_at"):
            assert item[field] == was[field], (item["version"], field)
    view, was = http.get("/admin/policy").json(), EXPECTED["policy"]
    assert view["settings"] == with_queue(was["settings"])
    # adaptive_prefill came later (issue 40): absent, the fixed cap, as it was
    later = {"adaptive_prefill": False} if "max_prefill_tokens" in was["effective_params"] else {}
    assert view["effective_params"] == {**was["effective_params"], **later}
    sources = {**was["sources"], "queue.name": "default"}
    if later:
        sources["policy.params.adaptive_prefill"] = "default"
    assert view["sources"] == sources


def test_its_schedules_and_guardrail_config_read_unchanged(http: httpx.Client) -> None:
    schedules = http.get("/admin/schedules").json()["items"]
    old = EXPECTED["schedules"]["items"]
    assert [{k: s[k] for k in SCHEDULE_FIELDS} for s in schedules] == [
        {k: s[k] for k in SCHEDULE_FIELDS} for s in old
    ]
    assert [s["memory_reserve"] for s in schedules] == [s["memory_reserve"] for s in old]
    assert [s["priority"] for s in schedules] == [s["priority"] for s in old]
    old_config = EXPECTED["guardrail"]
    # the objective of one priority class came later (issue 27): absent, it judges every request
    with_priority = {**old_config["objectives"], "priority": None}
    assert http.get("/admin/guardrail").json()["config"] == {
        **old_config,
        "objectives": with_priority,
    }


def test_every_stored_version_applies_again(http: httpx.Client) -> None:
    old = {item["version"]: item["settings"] for item in EXPECTED["history"]["items"]}
    for version, settings in sorted(old.items()):
        response = http.post(f"/admin/policy/rollback/{version}", json={"reason": "compat"})
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["status"]["state"] == "applied", result
        assert result["settings"] == with_queue(settings)
        scheduler = http.get("/admin/state").json()["scheduler"]
        assert scheduler["policy"] == settings["policy"]["name"]
        # the params given are in force (a null one shows what it stands for)
        given = {k: v for k, v in settings["policy"]["params"].items() if v is not None}
        assert {k: scheduler["params"][k] for k in given} == given


@pytest.mark.parametrize("path", sorted(FIXTURE.glob("v*.yaml")), ids=lambda p: p.stem)
def test_every_printed_policy_file_applies_unchanged(
    path: Path, server: ServerProcess, http: httpx.Client
) -> None:
    settings = yaml.safe_load(path.read_text())
    argv = [sys.executable, "-m", "control.cli", "policy", "apply", "-f", str(path)]
    argv += ["--url", server.url, "--token", TOKEN]
    run = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert http.get("/admin/policy").json()["settings"] == with_queue(settings)
    # applied again: the same setting in effect, nothing stored
    again = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and again.stdout.startswith("unchanged"), again.stdout
