"""``servedeck schedule list|get|create|delete`` against a real server: ``get`` prints the YAML
that ``create -f`` takes back (a round trip gives the same schedule), the next windows the
server previews, and the exit statuses of refusals and usage errors."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from control.cli import main
from control.schedules.cli import SCHEDULE_KEYS
from tests.control.admin_cli_support import cli_target, run_cli, server_fixture  # noqa: F401
from tests.control.support import ADMIN, ServerProcess

NIGHTLY = {
    "cron": "0 1 * * *",
    "until": "05:00",
    "timezone": "Europe/Berlin",
    "policy": {"name": "dynamic", "params": {"length_window": 64}},
    "memory_reserve": 0.2,
    "priority": 3,
}


server = server_fixture("schedule-cli")


def schedule(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "schedule", *argv)


def rest(server: ServerProcess, method: str, path: str) -> Any:
    with server.client(headers=ADMIN) as http:
        response = http.request(method, path)
    assert response.is_success, response.text
    return response.json()


def create(capsys, tmp_path: Path, body: dict[str, Any], *flags: str) -> int:
    path = tmp_path / "schedule.yaml"
    path.write_text(yaml.safe_dump(body))
    status, out, err = schedule(capsys, "create", "-f", str(path), *flags)
    assert status == 0, err
    assert out.startswith("created schedule ")
    return int(out.split()[2].rstrip(":"))


def test_create_stores_the_file_and_the_reason_flag_wins(capsys, server, tmp_path) -> None:
    sid = create(capsys, tmp_path, {**NIGHTLY, "reason": "in the file"}, "--reason", "nightly")
    stored = rest(server, "GET", f"/admin/schedules/{sid}")
    assert {key: stored[key] for key in NIGHTLY} == NIGHTLY
    assert stored["reason"] == "nightly"
    assert (stored["actor"], stored["cron_seconds"]) == ("admin", None)
    sid = create(capsys, tmp_path, {**NIGHTLY, "reason": "in the file"})
    assert rest(server, "GET", f"/admin/schedules/{sid}")["reason"] == "in the file"
    sid = create(capsys, tmp_path, NIGHTLY)
    assert rest(server, "GET", f"/admin/schedules/{sid}")["reason"] == (
        "servedeck schedule create -f schedule.yaml"
    )


def test_get_prints_yaml_that_create_takes_back(capsys, server, tmp_path) -> None:
    sid = create(capsys, tmp_path, {**NIGHTLY, "cron_seconds": "30", "reason": "round trip"})
    detail = rest(server, "GET", f"/admin/schedules/{sid}")
    status, out, _ = schedule(capsys, "get", str(sid))
    assert status == 0
    assert yaml.safe_load(out) == {key: detail[key] for key in SCHEDULE_KEYS}
    comments = [line for line in out.splitlines() if line.startswith("#")]
    state = "in force now" if detail["active"] else "not in force"
    assert comments[0].startswith(f"# servedeck schedule {sid} ({state}), by admin at ")
    windows = comments[comments.index("# next windows (UTC):") + 1 :]
    assert len(windows) == len(detail["next_firings"]) == 5
    for line, start, end in zip(windows, detail["next_firings"], detail["next_ends"], strict=True):
        first, second = line.removeprefix("#   ").split(" -> ")
        assert datetime.fromisoformat(first.rstrip("Z") + "+00:00") == datetime.fromisoformat(start)
        assert datetime.fromisoformat(second.rstrip("Z") + "+00:00") == datetime.fromisoformat(end)

    path = tmp_path / "from-get.yaml"
    path.write_text(out)
    status, made, _ = schedule(capsys, "create", "-f", str(path))
    again = rest(server, "GET", f"/admin/schedules/{int(made.split()[2].rstrip(':'))}")
    assert again["id"] != sid
    assert {key: again[key] for key in SCHEDULE_KEYS} == {key: detail[key] for key in SCHEDULE_KEYS}
    assert again["next_firings"] == detail["next_firings"]


def test_list_is_a_table_of_every_schedule(capsys, server, tmp_path) -> None:
    sid = create(capsys, tmp_path, {**NIGHTLY, "priority": 7, "reason": "listed"})
    page = rest(server, "GET", "/admin/schedules")
    status, out, _ = schedule(capsys, "list")
    assert status == 0
    lines = out.splitlines()
    header = ["ID", "CRON", "(TZ)", "UNTIL", "POLICY", "PRIORITY", "NEXT", "RUN", "ACTIVE"]
    assert lines[0].split() == header
    in_force = (
        f"schedule {page['active']}'s window is in force"
        if page["active"]
        else "no window in force"
    )
    assert lines[-1] == f"{len(page['items'])} schedules; {in_force}"
    row = next(line for line in lines[1:-1] if line.split()[0] == str(sid))
    next_run = datetime.fromisoformat(rest(server, "GET", f"/admin/schedules/{sid}")["next_run_at"])
    assert "0 1 * * * (Europe/Berlin)" in row
    assert "05:00" in row and "dynamic(length_window=64) reserve=0.2" in row
    cells = row.removesuffix("yes").split()  # the window of 01:00-05:00 Berlin may be in force
    assert cells[-3:] == ["7", *next_run.strftime("%Y-%m-%d %H:%M:%SZ").split()]
    assert len(lines) == len(page["items"]) + 2


def test_delete_removes_it_and_records_the_reason(capsys, server, tmp_path) -> None:
    sid = create(capsys, tmp_path, {**NIGHTLY, "reason": "to delete"})
    status, out, _ = schedule(capsys, "delete", str(sid), "--reason", "no nightly batch any more")
    assert status == 0
    assert out.startswith(f"deleted schedule {sid}: dynamic(length_window=64)")
    ids = [item["id"] for item in rest(server, "GET", "/admin/schedules")["items"]]
    assert sid not in ids
    status, _, err = schedule(capsys, "delete", str(sid), "--reason", "again")
    assert status == 1 and "refused (404)" in err
    assert schedule(capsys, "get", str(sid))[0] == 1


def test_a_bad_schedule_exits_1_naming_the_field(capsys, server, tmp_path) -> None:
    before = len(rest(server, "GET", "/admin/schedules")["items"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**NIGHTLY, "timezone": "Mars/Olympus", "reason": "bad"}))
    status, _, err = schedule(capsys, "create", "-f", str(path))
    assert status == 1
    assert err.startswith("servedeck schedule create: refused (422): body.timezone:")
    assert len(rest(server, "GET", "/admin/schedules")["items"]) == before


def test_usage_errors_exit_2(capsys, server, tmp_path) -> None:
    status, _, err = schedule(capsys, "create", "-f", str(tmp_path / "missing.yaml"))
    assert status == 2 and "cannot read" in err
    (tmp_path / "list.yaml").write_text("- 1\n")
    status, _, err = schedule(capsys, "create", "-f", str(tmp_path / "list.yaml"))
    assert status == 2 and "must hold a mapping with cron, until, policy, reason" in err
    (tmp_path / "bare.yaml").write_text(
        yaml.safe_dump(NIGHTLY | {"reason": "r"}) + "until: 15:00\n"
    )
    status, _, err = schedule(capsys, "create", "-f", str(tmp_path / "bare.yaml"))
    assert status == 2 and 'quote until, e.g. until: "15:00"' in err
    with pytest.raises(SystemExit) as exc:
        main(["schedule", "delete", "1"])  # --reason missing: argparse's usage error
    assert exc.value.code == 2
