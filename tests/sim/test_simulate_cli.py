"""``servedeck simulate`` writes what ``servedeck bench`` writes: results.json in the bench's
schema (every required run key), report.md, plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.report import REQUIRED_RUN_KEYS
from bench.simulate import run
from sim.trace import TraceRequest, write_trace


def test_simulate_a_trace_writes_the_bench_schema(tmp_path: Path) -> None:
    trace = tmp_path / "arrivals.csv"
    write_trace(trace, [TraceRequest(0.05 * i, 300 + 40 * i, 20 + i) for i in range(30)])
    out = tmp_path / "out"
    argv = ["--profile", "a100-80g/llama3-8b", "--trace", str(trace)]
    assert run([*argv, "--policies", "continuous,dynamic", "--out", str(out), "--no-plots"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert [r["policy"] for r in doc["runs"]] == ["continuous", "dynamic"]
    for r in doc["runs"]:
        assert set(REQUIRED_RUN_KEYS) <= r.keys()
        assert r["simulated"] and r["cost_model"] == "a100-80g/llama3-8b"
        assert r["completed"] == 30 and r["output_tokens"] == sum(20 + i for i in range(30))
        assert r["output_throughput"] > 0 and 0 < r["kv_utilization"] <= 1
        assert r["engine_overhead"] is None  # part of the cost model's step time
    report = (out / "report.md").read_text()
    assert "A prediction, not a measurement" in report and "a100-80g/llama3-8b" in report


def test_cli_runs_the_article_burst_with_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "control.cli", "simulate", "--profile", "h200/llama3-8b"]
    command += ["--workload", "article-20", "--policies", "continuous", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    (burst,) = doc["runs"]
    assert burst["suite"] == "burst" and burst["workload"] == "burst-fixed"
    assert burst["concurrency"] == 20 and burst["completed"] == 20
    assert "### burst-fixed, 20 concurrent" in (out / "report.md").read_text()
    assert list(out.glob("*.png"))
