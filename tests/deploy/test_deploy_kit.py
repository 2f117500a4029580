"""The deploy kit (deploy/): promtool accepts the scrape config and the alert rules and their
unit tests pass; every metric the Grafana dashboard and the alerts query is one a real
server's /metrics exposes; the dashboard shows what operators need and aggregates over the
``replica`` label; the container file pins the CPU torch."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.control.support import ServerProcess, wait_for
from tests.deploy.kit import (
    ALERTS,
    ALERTS_TEST,
    DEPLOY,
    PROMETHEUS_OWN,
    SCRAPE_CONFIG,
    alert_rules,
    dashboard,
    dashboard_queries,
    dashboard_variable_metrics,
    live_sample_names,
    metric_names,
    require,
)

REQUIRED_ALERTS = {
    "ServedeckKVReserveBreached",
    "ServedeckReclaimFailing",
    "ServedeckReclaimStale",
    "ServedeckTTFTP99OverObjective",
    "ServedeckWaitingQueueNearFull",
    "ServedeckEngineStalled",
    "ServedeckWaitingForKVBlocks",
    "ServedeckEngineThreadWaiting",
}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    argv = [require("promtool"), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_checks_the_alert_rules() -> None:
    result = promtool("check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_checks_the_scrape_config_and_the_rule_file_it_names() -> None:
    result = promtool("check", "config", SCRAPE_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_alert_unit_tests_pass() -> None:
    result = promtool("test", "rules", ALERTS_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_the_issue_asks_for_exist_and_group_by_replica() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(rules) >= REQUIRED_ALERTS
    for name in REQUIRED_ALERTS:
        assert "by (replica" in rules[name]["expr"], name
        assert rules[name]["annotations"]["summary"], name


def test_queue_alert_follows_the_servers_own_max_waiting() -> None:
    """The threshold is read from the server (servedeck_requests_waiting_max), not a number."""
    rule = next(r for r in alert_rules() if r["alert"] == "ServedeckWaitingQueueNearFull")
    assert "0.8 * sum by (replica) (servedeck_requests_waiting_max)" in rule["expr"]


def test_metric_names_are_found_and_only_metric_names() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, replica) (rate(a_bucket{x="y z"}[5m]))) > 2 '
        "or max by (p) (b offset 1m) unless on (p) group_left c_total * 1e3 "
        'and sum(rate(d_total{replica=~"$replica"}[$__rate_interval])) by (replica)'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c_total", "d_total"}
    assert metric_names("up{job='servedeck'} == 0") == {"up"}


def test_dashboard_shows_throughput_queue_kv_latency_and_policy_changes() -> None:
    board = dashboard()
    queries = dashboard_queries(board)
    used = set().union(*map(metric_names, queries))
    assert {
        "servedeck_generation_tokens_total",
        "servedeck_requests_waiting",
        "servedeck_requests_running",
        "servedeck_kv_blocks",
        "servedeck_time_to_first_token_seconds_bucket",
        "servedeck_time_per_output_token_seconds_bucket",
    } <= used
    assert any(q.startswith("sum by (state) (servedeck_kv_blocks") for q in queries)
    for metric in ("time_to_first_token", "time_per_output_token"):
        quantiles = [q for q in queries if f"servedeck_{metric}_seconds_bucket" in q]
        assert {q.split(",")[0] for q in quantiles} >= {
            "histogram_quantile(0.5",
            "histogram_quantile(0.99",
        }
    policy = [
        a for a in board["annotations"]["list"] if "servedeck_policy_info" in a.get("expr", "")
    ]
    assert len(policy) == 1 and "{{version}}" in policy[0]["titleFormat"]


def test_dashboard_shows_why_requests_wait() -> None:
    """Issue 41's row: waiting by reason (stacked) and its shares over the range, queue time
    p50/p99, preemptions by cause, and the share of step time the engine thread waited."""
    board = dashboard()
    (start,) = [i for i, p in enumerate(board["panels"]) if p["title"] == "Why requests wait"]
    panels = []
    for panel in board["panels"][start + 1 :]:  # the row's panels: up to the next row
        if panel["type"] == "row":
            break
        panels.append(panel)
    queries = [t["expr"] for p in panels for t in p["targets"]]
    wait = 'servedeck_request_wait_seconds_total{replica=~"$replica"}'
    stacked = f"sum by (reason) (rate({wait}[$__rate_interval]))"
    (by_reason,) = [p for p in panels if any(t["expr"] == stacked for t in p["targets"])]
    assert by_reason["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (shares,) = [p for p in panels if p["type"] == "piechart"]
    (share_target,) = shares["targets"]
    assert share_target["expr"].startswith(f"sum by (reason) (increase({wait}[$__range]))")
    assert share_target["instant"] is True
    queue = [q for q in queries if "servedeck_request_queue_time_seconds_bucket" in q]
    assert {q.split(",")[0] for q in queue} == {
        "histogram_quantile(0.5",
        "histogram_quantile(0.99",
    }
    assert any(q.startswith("sum by (cause) (rate(servedeck_preemptions_total") for q in queries)
    (engine,) = [q for q in queries if "servedeck_engine_step_cpu_seconds_total" in q]
    assert metric_names(engine) == {
        "servedeck_engine_step_seconds_total",
        "servedeck_engine_step_cpu_seconds_total",
    }
    assert engine.startswith("sum by (replica) (rate(servedeck_engine_step_seconds_total")


def test_dashboard_panels_have_unique_ids_and_do_not_overlap() -> None:
    board = dashboard()
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]
    order = [(p["gridPos"]["y"], p["gridPos"]["x"]) for p in panels]
    assert order == sorted(order), "panels are listed in the order they are laid out"


def test_dashboard_queries_aggregate_over_the_replica_variable() -> None:
    """Every selector filters on ``$replica`` and every query aggregates (sum/max by, or a
    quantile over ``sum by (le)``), so several replicas add up instead of drawing apart."""
    board = dashboard()
    assert "replica" in {v["name"] for v in board["templating"]["list"]}
    for query in dashboard_queries(board):
        selectors = re.findall(r"servedeck_\w+(\{[^}]*\})?", query)
        assert selectors and all('replica=~"$replica"' in s for s in selectors), query
        assert re.match(r"(sum|max|histogram_quantile)\b", query), query
        if query.startswith("histogram_quantile"):
            assert "sum by (le) (rate(" in query, query


@pytest.fixture(scope="module")
def live_metrics(server: ServerProcess) -> set[str]:
    """Sample names of a real server's /metrics after one completion has finished."""
    with server.client() as http:
        before = _finished(http.get("/metrics").text)
        body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 8}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        text = wait_for(lambda: _finished(t := http.get("/metrics").text) > before and t)
    return live_sample_names(text)


def _finished(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith("servedeck_time_to_first_token_seconds_count "):
            return float(line.split()[-1])
    return 0.0


def test_every_metric_the_dashboard_queries_is_in_the_live_metrics(
    live_metrics: set[str],
) -> None:
    board = dashboard()
    used = set().union(*map(metric_names, dashboard_queries(board)))
    used |= dashboard_variable_metrics(board)
    assert len(used) >= 15
    assert used - live_metrics == set()


def test_every_metric_the_alerts_query_is_in_the_live_metrics(live_metrics: set[str]) -> None:
    used = set().union(*(metric_names(rule["expr"]) for rule in alert_rules()))
    assert len(used) >= 8
    assert used - PROMETHEUS_OWN - live_metrics == set()


def test_container_file_pins_the_cpu_torch_wheel() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    installs = re.findall(r"pip install[^\n]*(?:\\\n[^\n]*)*", text)
    torch = [line for line in installs if re.search(r"\btorch\b", line)]
    assert torch, "the Containerfile installs no torch"
    for line in torch:
        assert "torch==2.13.0" in line and "download.pytorch.org/whl/cpu" in line, line


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` knows every directive (the venv's servedeck stands in for
    the installed one)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not found")
    installed = "/opt/servedeck/.venv/bin/servedeck"
    unit = (DEPLOY / "systemd" / "servedeck.service").read_text()
    assert f"ExecStart={installed} serve" in unit
    path = tmp_path / "servedeck.service"
    path.write_text(unit.replace(installed, str(Path(sys.executable).with_name("servedeck"))))
    result = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stderr
