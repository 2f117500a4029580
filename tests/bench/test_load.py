"""``servedeck load`` against a real server: a trace replayed at its arrival times with exact
lengths, a closed loop for a duration, the summary's figures, the CLI's table and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.load import LoadConfig, run_load
from sim.trace import TraceRequest, Uniform, write_trace
from tests.control.support import TOKEN, ServerProcess


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process = ServerProcess(
        tiny_model_dir, tmp_path_factory.mktemp("load"), ["--admin-token", TOKEN], {}
    )
    process.start()
    yield process.url
    process.stop()


def test_trace_replayed_at_its_times_with_exact_lengths(server: str, tmp_path: Path) -> None:
    requests = [TraceRequest(0.0, 20, 5), TraceRequest(0.5, 40, 9), TraceRequest(1.0, 8, 3)]
    trace = tmp_path / "trace.csv"
    write_trace(trace, requests)
    result = run_load(LoadConfig(url=server, trace=trace, duration_s=None))
    assert result.failed == 0 and len(result.records) == 3
    records = sorted(result.records, key=lambda r: r.index)
    sent = [r.metrics.arrival_time - result.started for r in records]
    for at, request in zip(sent, requests, strict=True):
        assert request.arrived_at <= at < request.arrived_at + 0.3  # on time, never early
    assert [r.prompt_tokens for r in records] == [20, 40, 8]
    assert [r.output_tokens for r in records] == [5, 9, 3]  # ignore_eos holds the length
    summary = result.summary()
    assert summary["completed"] == 3 and summary["output_tokens"] == 17
    assert 0 < summary["ttft_p50"] <= summary["ttft_p99"] <= summary["e2e_p99"]
    assert result.duration_s >= 1.0


def test_closed_loop_keeps_the_concurrency_for_the_duration(server: str) -> None:
    started = time.monotonic()
    config = LoadConfig(
        url=server,
        concurrency=3,
        duration_s=2.0,
        prompt_tokens=Uniform(8, 16),
        output_tokens=Uniform(4, 4),
    )
    result = run_load(config)
    assert result.failed == 0 and len(result.records) >= 3
    assert all(r.output_tokens == 4 for r in result.records)
    assert 2.0 <= time.monotonic() - started < 30
    # never more than three in flight: each client starts its next one after the last ended
    events = sorted(
        [(r.metrics.arrival_time, 1) for r in result.records]
        + [(r.metrics.finish_time, -1) for r in result.records]
    )
    in_flight = peak = 0
    for _, delta in events:
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak <= 3


def test_cli_prints_the_table_and_writes_json(server: str, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    argv = [sys.executable, "-m", "control.cli", "load", "--url", server, "--rate", "5"]
    argv += ["--duration", "1.5", "--prompt-tokens", "8-16", "--output-tokens", "4"]
    argv += ["--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "TTFT p99 (ms)" in done.stdout and "output tok/s" in done.stdout
    summary = json.loads(out.read_text())
    assert summary["completed"] >= 1 and summary["failed"] == 0
    bad = subprocess.run(
        [*argv[:5], "--rate", "1", "--concurrency", "2"], capture_output=True, text=True
    )
    assert bad.returncode == 2  # one mode only (argparse)


def test_unreachable_server_is_an_error(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "control.cli", "load", "--url", "http://127.0.0.1:9"]
    done = subprocess.run([*argv, "--rate", "1", "--duration", "1"], capture_output=True, text=True)
    assert done.returncode == 1 and "127.0.0.1:9" in done.stderr
