"""``/admin/state`` and ``/metrics`` are the engine's typed snapshot, read by attribute: the
engine reports the policy version it was given, and both views give the same KV figures."""

from __future__ import annotations

import re

import httpx

from tests.control.support import ADMIN, set_settings, state, wait_for


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_state_reports_the_policy_version_the_engine_runs(client: httpx.Client) -> None:
    before = state(client)
    assert before["policy_version"] is not None
    assert before["policy_version"] <= before["version"]
    target = "hybrid" if before["policy"]["name"] != "hybrid" else "continuous"
    result = set_settings(client, policy={"name": target, "params": {}})
    after = state(client)
    set_settings(client, policy=before["policy"])  # the shared server keeps its policy
    assert after["policy_version"] == result["version"] == after["version"]
    assert after["scheduler"]["policy"] == target
    kv = after["kv"]
    assert kv["free"] + kv["used"] + kv["cached"] == kv["total"] == len(after["block_map"])
    assert set(after["queue"]) == {"waiting", "running", "max_waiting"}
    assert after["queue"]["max_waiting"] >= 1  # the server's --max-waiting


def test_metrics_and_state_read_the_same_snapshot(client: httpx.Client) -> None:
    def idle_state() -> dict | None:
        snap = state(client)
        return None if snap["requests"] else snap

    idle = wait_for(idle_state, timeout=30)
    text = client.get("/metrics").text
    for block_state in ("free", "used", "cached"):
        name = f'servedeck_kv_blocks{{state="{block_state}"}}'
        assert _metric(text, name) == idle["kv"][block_state]
    assert _metric(text, "servedeck_kv_reserve_ratio") == idle["memory_reserve"]
    assert _metric(text, "servedeck_requests_running") == idle["scheduler"]["running"] == 0


def test_kv_integrity_check_passes_on_a_serving_engine(client: httpx.Client) -> None:
    done = client.post("/v1/completions", json={"prompt": "Check the books", "max_tokens": 4})
    assert done.status_code == 200
    response = client.get("/admin/kv/integrity", headers=ADMIN)
    assert response.status_code == 200, response.text
    report = response.json()
    assert report == {"ok": True, "problems": [], "stats": report["stats"]}
    kv = report["stats"]
    assert kv["free"] + kv["used"] + kv["cached"] == kv["total"]
    assert client.get("/admin/kv/integrity").status_code == 401
