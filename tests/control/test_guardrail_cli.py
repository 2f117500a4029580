"""``servedeck guardrail get|set|mode|decisions`` against a real server with a cost model:
``get`` prints the YAML that ``set -f`` takes back (the status as comments), ``mode off`` (the
kill switch) changes only the mode, ``decisions`` tabulates what the guardrail proposed with the
predicted and the observed TTFT p99; refusals exit 1 naming the field, usage errors exit 2."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from control.cli import main
from control.guardrail.cli import ERROR_NOTE
from tests.control.admin_cli_support import cli_target, run_cli, server_fixture  # noqa: F401
from tests.control.support import ADMIN, ServerProcess, set_settings, wait_for

SMALL_BUDGET = {"name": "continuous", "params": {"max_num_batched_tokens": 16}}
CONFIG = {
    "mode": "shadow",
    "objectives": {
        "ttft_p99_s": 1e-6,
        "tpot_p99_s": None,
        "goodput_min_rps": None,
        "priority": None,
    },
    "bounds": {
        "policies": ["continuous"],
        "max_num_seqs": None,
        "max_num_batched_tokens": {"min": 16, "max": 2048},
        "max_prefill_tokens": None,
        "single_request_below": None,
        "max_wait_s": None,
        "memory_reserve": None,
    },
    "interval_s": 2.0,
    "window_s": 600.0,
    "min_change_interval_s": 3600.0,
    "hysteresis": 0.0,
    "max_candidates": 4,
}
"""An impossible TTFT objective and a 16-token step budget the bounds let it raise: the
guardrail proposes a larger budget at every evaluation (as in test_guardrail_server.py)."""

server = server_fixture(
    "guardrail-cli", "--cost-model", "a100-80g/llama3-8b", "--prediction-timeout-s", "20"
)


def guardrail(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "guardrail", *argv)


def view(server: ServerProcess) -> dict[str, Any]:
    with server.client(headers=ADMIN) as http:
        response = http.get("/admin/guardrail")
    assert response.status_code == 200, response.text
    return response.json()


def decisions(server: ServerProcess) -> list[dict[str, Any]]:
    with server.client(headers=ADMIN) as http:
        response = http.get("/admin/guardrail/decisions", params={"limit": 200})
    assert response.status_code == 200, response.text
    return response.json()["items"]


def burst(server: ServerProcess, n: int) -> None:
    """``n`` concurrent 200-token prompts, all finished on return."""

    def one(i: int) -> None:
        prompt = [(i * 7 + j) % 4000 + 10 for j in range(200)]
        body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0.0}
        with server.client() as http:
            assert http.post("/v1/completions", json=body).status_code == 200

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def set_file(capsys, tmp_path: Path, config: dict[str, Any], *flags: str) -> str:
    path = tmp_path / "guardrail.yaml"
    path.write_text(yaml.safe_dump(config))
    status, out, err = guardrail(capsys, "set", "-f", str(path), *flags)
    assert status == 0, err
    return out


def test_get_prints_yaml_that_set_takes_back(capsys, server, tmp_path) -> None:
    status, out, _ = guardrail(capsys, "get")
    assert status == 0
    before = view(server)
    assert yaml.safe_load(out) == before["config"]
    comments = [line for line in out.splitlines() if line.startswith("#")]
    assert comments[0] == "# servedeck guardrail revision 0 (the defaults, never stored)"
    assert "# status: off: mode off (the kill switch)" in comments
    assert "# cost model: a100-80g/llama3-8b; correction -; margin -" in comments

    path = tmp_path / "got.yaml"
    path.write_text(out)
    status, stored, _ = guardrail(capsys, "set", "-f", str(path))
    assert (status, stored.splitlines()[0]) == (0, "stored revision 1: mode off")
    after = view(server)
    assert after["config"] == before["config"]
    assert (after["actor"], after["reason"]) == ("admin", "servedeck guardrail set -f got.yaml")
    status, again, _ = guardrail(capsys, "get")
    assert again.startswith("# servedeck guardrail revision 1 by admin at ")
    assert again.splitlines()[0].endswith(": servedeck guardrail set -f got.yaml")


def test_set_takes_the_reason_from_the_flag_then_the_file(capsys, server, tmp_path) -> None:
    config = CONFIG | {"mode": "off"}
    out = set_file(capsys, tmp_path, config | {"reason": "in the file"}, "--reason", "flag")
    revision = view(server)["revision"]
    assert out.splitlines()[0] == f"stored revision {revision}: mode off"
    assert (view(server)["reason"], view(server)["config"]) == ("flag", config)
    set_file(capsys, tmp_path, config | {"reason": "in the file"})
    assert (view(server)["revision"], view(server)["reason"]) == (revision + 1, "in the file")


def test_mode_off_changes_only_the_mode(capsys, server, tmp_path) -> None:
    """The kill switch: objectives, bounds and intervals stay as they are."""
    set_file(capsys, tmp_path, CONFIG | {"mode": "on", "reason": "tuned"})
    revision = view(server)["revision"]
    status, out, _ = guardrail(capsys, "mode", "off", "--reason", "incident 42")
    assert status == 0
    assert out.splitlines() == [
        f"stored revision {revision + 1}: mode on -> off",
        "# status: off: mode off (the kill switch)",
    ]
    after = view(server)
    assert after["config"] == CONFIG | {"mode": "off"}
    assert (after["reason"], after["status"]["active"]) == ("incident 42", False)
    status, out, _ = guardrail(capsys, "mode", "off", "--reason", "again")
    assert (status, out.splitlines()[0]) == (0, f"stored revision {revision + 2}: mode off")


def test_decisions_tabulate_proposals_with_prediction_and_observation(capsys, server) -> None:
    with server.client(headers=ADMIN) as http:
        set_settings(http, policy=SMALL_BUDGET)
        burst(server, 8)  # five finished requests are the least an evaluation reads
        response = http.put("/admin/guardrail", json=CONFIG | {"reason": "watch"})
        assert response.status_code == 200, response.text
    try:
        wait_for(lambda: decisions(server), 60, 0.2)

        def measured() -> list[dict[str, Any]] | None:  # traffic inside an interval after one
            rows = decisions(server)
            if any((d["prediction_error"] or {}).get("ttft_p99_s") for d in rows):
                return rows
            burst(server, 4)
            return None

        wait_for(measured, 90, 0.5)
        status, out, _ = guardrail(capsys, "decisions", "--limit", "200", "-v")
        rows = decisions(server)
    finally:
        guardrail(capsys, "mode", "off", "--reason", "test done")
    assert status == 0
    lines = out.splitlines()
    header = "ID AT OUTCOME CHANGE TTFT P99 PREDICTED NOW -> CHOSEN OBSERVED ERROR"
    assert lines[0].split() == header.split()
    assert lines[-1] == f"{len(rows)} decisions; {ERROR_NOTE}"
    table = {line.split()[0]: line for line in lines[1 : 1 + len(rows)]}
    for row in rows:
        line = table[str(row["id"])]
        chosen = row["chosen"]["policy"]["params"]["max_num_batched_tokens"]
        assert line.split()[3] == "shadow"
        assert f"  max_num_batched_tokens 16 -> {chosen}  " in line
        now, then = row["predicted_current"]["ttft_p99_s"], row["predicted"]["ttft_p99_s"]
        assert f"  {now:.3g} s -> {then:.3g} s  " in line
        assert f"{row['id']}: {row['reason']}" in lines
    row = next(d for d in rows if (d["prediction_error"] or {}).get("ttft_p99_s"))
    cells = table[str(row["id"])].split()
    assert cells[-3:] == [
        f"{row['observed_after']['ttft_p99_s']:.3g}",
        "s",
        f"x{row['prediction_error']['ttft_p99_s']:.2f}",
    ]


def test_a_bad_config_exits_1_naming_the_field(capsys, server, tmp_path) -> None:
    revision = view(server)["revision"]
    path = tmp_path / "bad.yaml"
    bounds = CONFIG["bounds"] | {"max_num_seqs": {"min": 64, "max": 16}}
    path.write_text(yaml.safe_dump(CONFIG | {"bounds": bounds}))
    status, _, err = guardrail(capsys, "set", "-f", str(path))
    assert status == 1
    assert err.startswith("servedeck guardrail set: refused (422): body.bounds.max_num_seqs:")
    assert view(server)["revision"] == revision


def test_usage_errors_exit_2(capsys, server, tmp_path) -> None:
    status, _, err = guardrail(capsys, "set", "-f", str(tmp_path / "missing.yaml"))
    assert status == 2 and "cannot read" in err
    for argv in (["mode", "off"], ["mode", "auto", "--reason", "r"]):
        with pytest.raises(SystemExit) as exc:
            main(["guardrail", *argv])  # --reason missing; no such mode
        assert exc.value.code == 2
