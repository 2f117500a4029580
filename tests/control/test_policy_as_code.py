"""``servedeck policy get|apply|diff|history|rollback`` against a real server: applying a file
equal in effect to the active setting stores nothing, a changed file makes exactly one version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from control.cli import main
from tests.control.admin_cli_support import cli_target, run_cli, server_fixture  # noqa: F401
from tests.control.support import ADMIN, TOKEN, ServerProcess

server = server_fixture("policy-as-code")
"""A server of its own: these tests count versions, no other test may add any."""


def policy(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "policy", *argv)


def total(server: ServerProcess) -> int:
    response = httpx.get(f"{server.url}/admin/policy/history", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()["total"]


def active(server: ServerProcess) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/admin/policy", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def get_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    status, out, _ = policy(capsys, "get")
    assert status == 0
    path = tmp_path / "policy.yaml"
    path.write_text(out)
    return path


def test_get_prints_yaml_of_the_active_settings(capsys, server, tmp_path) -> None:
    path = get_file(capsys, tmp_path)
    view = active(server)
    assert path.read_text().startswith(f"# servedeck policy version {view['version']} ")
    assert yaml.safe_load(path.read_text()) == view["settings"]


def test_apply_of_the_file_get_printed_stores_nothing(capsys, server, tmp_path) -> None:
    path = get_file(capsys, tmp_path)
    before, version = total(server), active(server)["version"]
    status, out, _ = policy(capsys, "apply", "-f", str(path))
    assert status == 0
    assert f"unchanged: version {version}" in out
    assert total(server) == before
    assert active(server)["version"] == version


def test_a_file_equal_in_effect_stores_nothing(capsys, server, tmp_path) -> None:
    """Every default written out (engine caps included) is the same setting as ``{}``."""
    view = active(server)
    settings = view["settings"] | {
        "policy": {"name": view["settings"]["policy"]["name"], "params": view["effective_params"]}
    }
    assert settings["policy"] != view["settings"]["policy"]
    path = tmp_path / "explicit.yaml"
    path.write_text(yaml.safe_dump(settings))
    before = total(server)
    status, out, _ = policy(capsys, "apply", "-f", str(path))
    assert (status, total(server)) == (0, before), out
    assert "unchanged" in out


def test_a_changed_file_makes_exactly_one_version(capsys, server, tmp_path) -> None:
    path = get_file(capsys, tmp_path)
    data = yaml.safe_load(path.read_text())
    data["policy"] = {"name": "dynamic", "params": {"max_batch_size": 8}}
    data["memory_reserve"] = 0.125
    path.write_text(yaml.safe_dump(data))
    before = total(server)
    status, out, _ = policy(capsys, "apply", "-f", str(path), "--reason", "nightly batch")
    assert status == 0, out
    assert f"stored version {before + 1} (applied)" in out
    assert '  policy.name: "continuous" -> "dynamic"' in out
    assert total(server) == before + 1
    view = active(server)
    assert view["settings"] == data
    assert (view["reason"], view["actor"]) == ("nightly batch", "admin")
    assert policy(capsys, "apply", "-f", str(path))[0] == 0  # again: nothing new
    assert total(server) == before + 1


def test_diff_and_dry_run_store_nothing(capsys, server, tmp_path) -> None:
    path = get_file(capsys, tmp_path)
    data = yaml.safe_load(path.read_text())
    data["reclaim_interval_s"] = data["reclaim_interval_s"] + 1.0
    path.write_text(yaml.safe_dump(data))
    before, version = total(server), active(server)["version"]
    for argv in (["diff", "-f", str(path)], ["apply", "-f", str(path), "--dry-run"]):
        status, out, _ = policy(capsys, *argv)
        assert status == 0
        assert f"dry run against version {version}: nothing stored" in out
        assert "  reclaim_interval_s: " in out
    assert total(server) == before


def test_stale_if_match_exits_1_with_the_servers_message(capsys, server, tmp_path) -> None:
    path = get_file(capsys, tmp_path)
    data = yaml.safe_load(path.read_text())
    data["memory_reserve"] = 0.2 if data["memory_reserve"] != 0.2 else 0.15
    path.write_text(yaml.safe_dump(data))
    version, before = active(server)["version"], total(server)
    status, out, err = policy(capsys, "apply", "-f", str(path), "--if-match", str(version - 1))
    assert status == 1
    assert f"refused (409): version is {version}, not {version - 1}: reload and retry" in err
    assert total(server) == before
    status, out, _ = policy(capsys, "apply", "-f", str(path), "--if-match", str(version))
    assert (status, total(server)) == (0, before + 1), out


def test_invalid_file_exits_1_naming_the_field(capsys, server, tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("policy: {name: dynamic, params: {max_batch_size: 0}}\n")
    before = total(server)
    status, _, err = policy(capsys, "apply", "-f", str(path))
    assert status == 1
    assert "refused (422): body.policy.params.max_batch_size:" in err
    assert total(server) == before


def test_rollback_stores_a_copy_of_the_old_version(capsys, server) -> None:
    first = httpx.get(f"{server.url}/admin/policy/history?offset=0&limit=100", headers=ADMIN)
    oldest = first.json()["items"][-1]
    before = total(server)
    status, out, _ = policy(capsys, "rollback", str(oldest["version"]), "--reason", "undo")
    assert status == 0, out
    assert f"stored version {before + 1}" in out
    view = active(server)
    assert view["settings"] == oldest["settings"]
    assert view["reason"] == "undo"
    status, out, _ = policy(capsys, "history", "--limit", "2")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split()[0] == str(before + 1)
    assert f"(rollback of {oldest['version']})" in lines[0]
    assert lines[-1] == f"2 of {before + 1} versions"
    assert policy(capsys, "rollback", "999999")[0] == 1


def test_usage_errors_exit_2(capsys, server, tmp_path, monkeypatch) -> None:
    status, _, err = policy(capsys, "apply", "-f", str(tmp_path / "missing.yaml"))
    assert status == 2 and "cannot read" in err
    (tmp_path / "list.yaml").write_text("- 1\n")
    assert policy(capsys, "apply", "-f", str(tmp_path / "list.yaml"))[0] == 2
    (tmp_path / "broken.yaml").write_text("policy: [\n")
    assert policy(capsys, "diff", "-f", str(tmp_path / "broken.yaml"))[0] == 2
    monkeypatch.delenv("SERVEDECK_ADMIN_TOKEN")
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path))  # no saved local token there
    status, _, err = policy(capsys, "get")
    assert status == 2 and "no admin token" in err
    with pytest.raises(SystemExit) as exc:
        main(["policy", "apply"])  # -f missing: argparse's usage error
    assert exc.value.code == 2


def test_token_file_and_a_wrong_token(capsys, server, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SERVEDECK_ADMIN_TOKEN")
    (tmp_path / "token").write_text(TOKEN + "\n")
    assert policy(capsys, "get", "--token-file", str(tmp_path / "token"))[0] == 0
    wrong = "wrong-token-0123456789abcdef"
    status, out, err = policy(capsys, "get", "--token", wrong)
    assert status == 1 and "refused (403)" in err
    assert wrong not in out + err


def test_the_installed_command_reads_url_and_token_from_the_environment(server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
    env |= {"SERVEDECK_URL": server.url, "SERVEDECK_ADMIN_TOKEN": TOKEN}
    done = subprocess.run(
        [sys.executable, "-m", "control.cli", "policy", "get"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == active(server)["settings"]
    assert TOKEN not in done.stdout + done.stderr


def test_put_equal_in_effect_answers_stored_false(server) -> None:
    """The server decides: the REST answer says nothing was stored and names the active
    version; a dry run is never stored either."""
    view = active(server)
    body = {**view["settings"], "reason": "same again"}
    with server.client(headers=ADMIN) as http:
        result = http.put("/admin/policy", json=body).json()
        assert result["stored"] is False and result["dry_run"] is False
        assert result["version"] == view["version"] and result["diff"] == []
        assert result["applied"] is True and result["status"]["state"] == "applied"
        dry = http.put("/admin/policy", params={"dry_run": "true"}, json=body).json()
        assert dry["stored"] is False
        body["memory_reserve"] = 0.3 if view["settings"]["memory_reserve"] != 0.3 else 0.25
        changed = http.put("/admin/policy", json=body).json()
        assert changed["stored"] is True and changed["version"] == view["version"] + 1
