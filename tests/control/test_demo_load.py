"""The demo load (``servedeck serve --demo-load``, which ``make run`` passes through ``up``):
within 30 s of the server being ready, requests run and throughput is above zero; the console's
``PUT /admin/demo-load`` pauses it (rate 0) and resumes it; off unless asked for. With a chat
template (the tiny checkpoint has one) it sends chat requests, whose ids the engine's snapshot
shows (``chatcmpl-``); without one, token-id completions (``cmpl-``)."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.support import ADMIN, TOKEN, ServerProcess, wait_for

API_KEY = "demo-load-test-api-key"


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    args = ["--admin-token", TOKEN, "--api-key", API_KEY, "--demo-load", "4"]
    process = ServerProcess(tiny_model_dir, tmp_path, args, {})
    process.start()
    yield process
    process.stop()


def demo(http: httpx.Client) -> dict:
    response = http.get("/admin/demo-load", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def running_kinds(http: httpx.Client) -> set[str]:
    """The id prefixes of the requests the engine holds now: the route each one came in by."""
    state = http.get("/admin/state", headers=ADMIN).json()
    return {request["id"].split("-")[0] for request in state["requests"]}


def test_demo_load_runs_pauses_and_resumes(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        ready = time.monotonic()
        assert wait_for(lambda: running_kinds(http), timeout=30) <= {"chatcmpl"}

        def busy() -> bool:
            state = http.get("/admin/state", headers=ADMIN).json()
            return (
                state["totals"]["requests_finished"] > 0
                and state["throughput"]["output_tokens_per_s"] > 0
            )

        wait_for(busy, timeout=30)
        assert time.monotonic() - ready < 30
        view = demo(http)
        assert view["enabled"] and view["running"] and view["rate"] == 4
        assert view["sent"] > 0 and view["completed"] > 0 and view["failed"] == 0

        paused = http.put("/admin/demo-load", json={"rate": 0}, headers=ADMIN)
        assert paused.status_code == 200 and paused.json()["rate"] == 0
        time.sleep(1.0)  # anything sent before the pause has landed
        sent = demo(http)["sent"]
        time.sleep(2.0)
        assert demo(http)["sent"] == sent  # paused: nothing new

        resumed = http.put("/admin/demo-load", json={"rate": 8}, headers=ADMIN)
        assert resumed.status_code == 200
        wait_for(lambda: demo(http)["sent"] > sent, timeout=10)

        bad = http.put("/admin/demo-load", json={"rate": -1}, headers=ADMIN)
        assert bad.status_code == 422 and "rate" in bad.text
        assert http.put("/admin/demo-load", json={"rate": 1}).status_code == 401


def test_token_prompts_without_a_chat_template(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    process = ServerProcess(model, tmp_path, ["--admin-token", TOKEN, "--demo-load", "4"], {})
    process.start()
    try:
        with httpx.Client(base_url=process.url, timeout=30) as http:
            assert wait_for(lambda: running_kinds(http), timeout=30) == {"cmpl"}
            wait_for(lambda: demo(http)["completed"] > 0, timeout=30)
            assert demo(http)["failed"] == 0
        assert "sends token-id prompts to /v1/completions" in process.log()
    finally:
        process.stop()


def test_off_unless_asked(tiny_model_dir: Path, tmp_path: Path) -> None:
    process = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN], {})
    process.start()
    try:
        with httpx.Client(base_url=process.url, timeout=30) as http:
            assert demo(http) == {
                "enabled": False, "rate": 0.0, "start_rate": 0.0, "sent": 0, "completed": 0,
                "failed": 0,
                "running": False,
            }  # fmt: skip
            time.sleep(1.0)
            state = http.get("/admin/state", headers=ADMIN).json()
            assert state["totals"]["requests_finished"] == 0
            refused = http.put("/admin/demo-load", json={"rate": 1}, headers=ADMIN)
            assert refused.status_code == 409 and "--demo-load" in refused.text
    finally:
        process.stop()


def test_a_drain_cuts_the_demo_load_off_cleanly(tiny_model_dir: Path, tmp_path: Path) -> None:
    """SIGTERM with the demo load's requests in flight (held by a stalled engine step): the
    drain starts at once (the demo stops sending; its requests drain like any other), and
    the process ends without a task of the demo's loop destroyed pending."""
    args = ["--admin-token", TOKEN, "--demo-load", "8", "--stall-timeout-s", "1"]
    process = ServerProcess(tiny_model_dir, tmp_path, args, {"SERVEDECK_TESTING": "1"})
    process.start()
    try:
        with httpx.Client(base_url=process.url, timeout=30) as http:
            wait_for(lambda: running_kinds(http), timeout=30)
            stalled = http.post("/admin/testing/stall", params={"seconds": 8}, headers=ADMIN)
            assert stalled.status_code == 200, stalled.text
            wait_for(lambda: http.get("/ready").status_code == 503, timeout=10)  # held
        assert process.proc is not None
        signalled = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "draining: waiting up to" in process.log(), timeout=30, interval=0.02)
        assert time.monotonic() - signalled < 2.0  # not held by the demo's thread
        assert process.proc.wait(60) == 0
    finally:
        process.stop()
    log = process.log()
    assert "Task was destroyed but it is pending" not in log, log[-3000:]
    assert "the demo load stopped" not in log, log[-3000:]
