"""The kit against a real Prometheus (Debian's ``prometheus`` binary): it scrapes one real
server as two replicas with deploy/prometheus/prometheus.yml's job and loads alerts.yml; every
rule evaluates without error; every dashboard query runs and answers; the KV panel's sum spans
both replicas; the waiting panel has every reason and the engine-waiting panel both replicas; a
policy change shows up in the annotation query with its version."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from engine.timeline import WaitReason
from tests.control.support import (
    ADMIN,
    NUM_KV_BLOCKS,
    ServerProcess,
    free_port,
    set_settings,
    wait_for,
)
from tests.deploy.kit import ALERTS, SCRAPE_CONFIG, dashboard, dashboard_queries, require

WINDOW = "10s"
"""What ``$__rate_interval`` becomes: several 1 s scrapes."""


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]


def grafana(expr: str) -> str:
    """A dashboard query as Grafana sends it with every replica selected (the dashboard's
    range, ``$__range``, as short as the rate window)."""
    for variable, value in (("$__rate_interval", WINDOW), ("$__range", WINDOW)):
        expr = expr.replace(variable, value)
    return expr.replace("$replica", ".*")


@pytest.fixture(scope="module")
def prometheus(
    server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """Our scrape config with the server as replicas a and b, scraped every second."""
    binary = require("prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    target = server.url.removeprefix("http://")
    job["scrape_interval"] = "1s"
    job["static_configs"] = [
        {"targets": [target], "labels": {"replica": replica}} for replica in ("a", "b")
    ]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(ALERTS, folder / "alerts.yml")
    url = f"http://127.0.0.1:{free_port()}"
    argv = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address={url.removeprefix('http://')}",
    ]
    with (folder / "prometheus.log").open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _ready(url, process, folder), timeout=30)
        yield Prometheus(url)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str, process: subprocess.Popen, folder: Path) -> bool:
    if process.poll() is not None:
        pytest.fail(f"prometheus exited: {(folder / 'prometheus.log').read_text()[-3000:]}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_dashboard_and_rules_work_on_a_real_prometheus(
    server: ServerProcess, prometheus: Prometheus
) -> None:
    up = 'count(up{job="servedeck"} == 1)'
    wait_for(lambda: (r := prometheus.query(up)) and r[0]["value"][1] == "2", timeout=30)
    with server.client() as http:
        for prompt in ("Hello there", "The scheduler", "One more"):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 16}
            assert http.post("/v1/completions", json=body).status_code == 200
        set_settings(http, policy={"name": "static", "params": {}})
        version = http.get("/admin/policy", headers=ADMIN).json()["version"]

    tokens = f"sum(rate(servedeck_generation_tokens_total[{WINDOW}]))"
    wait_for(lambda: (r := prometheus.query(tokens)) and float(r[0]["value"][1]) > 0, timeout=30)
    board = dashboard()
    for expr in dashboard_queries(board):
        result = prometheus.query(grafana(expr))
        if not expr.rstrip().endswith("> 0"):  # a filter may leave nothing: no refusals here
            assert result, expr

    (by_state,) = [q for q in dashboard_queries(board) if q.startswith("sum by (state)")]
    kv = prometheus.query(grafana(by_state))
    assert {row["metric"]["state"] for row in kv} == {"free", "used", "cached"}
    assert sum(float(row["value"][1]) for row in kv) == 2 * NUM_KV_BLOCKS  # both replicas

    # Issue 41's row: every reason is a series (0 until seen), the engine's share per replica.
    wait = "sum by (reason) (rate(servedeck_request_wait_seconds_total"
    (by_reason,) = [q for q in dashboard_queries(board) if q.startswith(wait)]
    assert {row["metric"]["reason"] for row in prometheus.query(grafana(by_reason))} == {
        reason.value for reason in WaitReason
    }
    (engine,) = [q for q in dashboard_queries(board) if "engine_step_cpu" in q]
    assert {row["metric"]["replica"] for row in prometheus.query(grafana(engine))} == {"a", "b"}

    (annotation,) = [a for a in board["annotations"]["list"] if "expr" in a]

    def changes() -> set[tuple[str, str]]:
        rows = prometheus.query(grafana(annotation["expr"]))
        return {(row["metric"]["policy"], row["metric"]["version"]) for row in rows}

    # The change shows once a scrape after it is in (the tokens' rate above can come from
    # scrapes made before it).
    wait_for(lambda: ("static", str(version)) in changes())

    rules = wait_for(lambda: _evaluated_rules(prometheus), timeout=15)
    assert len(rules) == len(yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"])
    assert [r["name"] for r in rules if r["health"] != "ok"] == []


def _evaluated_rules(prometheus: Prometheus) -> list[dict[str, Any]] | None:
    response = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()
    rules = [rule for group in response["data"]["groups"] for rule in group["rules"]]
    return rules if rules and all(r["health"] != "unknown" for r in rules) else None
