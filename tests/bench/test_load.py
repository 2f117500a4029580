"""``servedeck load`` against a real server: a trace replayed at its arrival times with exact
lengths, a closed loop for a duration, the summary's figures, the CLI's table and exit code;
chat prompts sent to ``/v1/chat/completions``, their shared system prompt served from the
prefix cache."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.chat_prompts import ChatPrompts
from bench.load import LoadConfig, run_load
from bench.load_cli import add_parser
from sim.trace import TraceRequest, Uniform, write_trace
from tests.control.support import ADMIN, TOKEN, ServerProcess

CHAT_MAX_TOKENS = 4


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


def prefilled(url: str) -> int:
    """Prompt tokens the server computed (a prefix-cache hit computes none of its tokens)."""
    state = httpx.get(f"{url}/admin/state", headers=ADMIN, timeout=30).json()
    return state["totals"]["prompt_tokens"]


def test_chat_prompts_share_the_cached_system_prompt(server: str) -> None:
    shipped = ChatPrompts.shipped()
    shared = tuple(  # the shipped group behind the shared system prompt, short answers
        c.model_copy(update={"max_tokens": CHAT_MAX_TOKENS})
        for c in shipped.conversations
        if c.shared_system
    )
    prompts = ChatPrompts(shared, temperature=0.0)
    before = prefilled(server)
    config = LoadConfig(url=server, concurrency=2, duration_s=1.5, chat_prompts=prompts)
    result = run_load(config)
    assert result.failed == 0 and len(result.records) >= 4, result.failures
    # the usage chunk gave each prompt's length: the template's rendering, longer than the text
    system = shipped.shared_system_prompt
    assert system is not None
    assert all(r.prompt_tokens > len(system) // 8 for r in result.records)
    # a chat stream's role chunk is not a token: at most max_tokens counted, and all of them
    # where the answer ran to its limit
    assert all(1 <= r.output_tokens <= CHAT_MAX_TOKENS for r in result.records)
    assert max(r.output_tokens for r in result.records) == CHAT_MAX_TOKENS
    assert all(r.metrics.ttft is not None and r.metrics.ttft > 0 for r in result.records)
    sent = sum(r.prompt_tokens for r in result.records)
    computed = prefilled(server) - before
    # every request after the first two found the system prompt's blocks cached
    assert computed < sent - (len(result.records) - 2) * len(system) // 8, (computed, sent)


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


def test_chat_prompts_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["load", "--rate", "1", "--chat-prompts"])
    assert args.chat_prompts == ChatPrompts.shipped()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["load", "--rate", "1", "--chat-prompts", str(tmp_path / "no.json")])
    assert exited.value.code == 2 and "no.json" in capsys.readouterr().err


def test_cli_sends_the_shipped_chat_prompts(server: str) -> None:
    argv = [sys.executable, "-m", "control.cli", "load", "--url", server, "--concurrency", "2"]
    argv += ["--duration", "1", "--chat-prompts"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "failed:" not in done.stderr
    completed = next(line for line in done.stdout.splitlines() if "requests completed" in line)
    assert int(completed.split()[-1]) >= 1


def test_unreachable_server_is_an_error(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "control.cli", "load", "--url", "http://127.0.0.1:9"]
    done = subprocess.run([*argv, "--rate", "1", "--duration", "1"], capture_output=True, text=True)
    assert done.returncode == 1 and "127.0.0.1:9" in done.stderr
