"""Liveness and readiness, the stall watchdog and graceful shutdown, each against a real
server (the stall injected through the test-only route)."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from control import context
from control.core.config import Settings
from control.server import create_app
from tests.control.support import ADMIN, TOKEN, ServerProcess, sse_events, state, wait_for

STALLS = "servedeck_engine_stalls_total"


def metric(http: httpx.Client, sample: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in /metrics")


class Stream:
    """One completion read on a thread of its own: streamed (``lines``), or whole (``lines``
    is its one body); ``error`` is the transport's failure, if any (a truncated body)."""

    def __init__(self, server: ServerProcess, max_tokens: int, stream: bool = True) -> None:
        self.lines: list[str] = []
        self.status: int | None = None
        self.error: httpx.TransportError | None = None
        body = {
            "prompt": "Once upon a time",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        }

        def read() -> None:
            try:
                with (
                    server.client() as http,
                    http.stream("POST", "/v1/completions", json=body) as r,
                ):
                    self.status = r.status_code
                    self.lines.extend(r.iter_lines())
            except httpx.TransportError as exc:
                self.error = exc

        self.thread = threading.Thread(target=read)
        self.thread.start()

    def events(self, timeout: float = 60) -> list[Any]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not end"
        return sse_events(self.lines)


def ready(server: ServerProcess) -> httpx.Response:
    return httpx.get(f"{server.url}/ready", timeout=5)


def test_ready_is_503_while_loading_then_names_a_failed_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def slow_failing_load(*_args: Any, **_kwargs: Any) -> None:
        release.wait(10)
        raise RuntimeError("no such model")

    monkeypatch.setattr(context, "build_runtime", slow_failing_load)
    app = create_app(Settings(db=tmp_path / "x.db", model=tmp_path), "t" * 16)
    with TestClient(app) as client:
        loading = client.get("/ready")
        assert loading.status_code == 503
        assert loading.json()["reason"] == "loading"
        assert loading.headers["retry-after"] == "1"
        release.set()
        wait_for(lambda: app.state.ctx.load_error is not None, timeout=10)
        failed = client.get("/ready").json()
        assert (failed["reason"], failed["detail"]) == ("failed", "RuntimeError: no such model")


def test_ready_and_health_are_200_while_serving(client: httpx.Client) -> None:
    assert client.get("/ready").json() == {"status": "ready"}
    assert client.get("/health").json()["status"] == "ok"


def test_stalled_engine_is_not_ready_counted_once_and_logged_then_recovers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = ServerProcess(
        tiny_model_dir,
        tmp_path,
        ["--admin-token", TOKEN, "--stall-timeout-s", "1"],
        {"SERVEDECK_TESTING": "1"},
    )
    server.start()
    try:
        with server.client(headers=ADMIN) as http:
            assert metric(http, STALLS) == 0
            stream = Stream(server, max_tokens=300)
            wait_for(lambda: state(http)["queue"]["running"] == 1)
            request_id = state(http)["requests"][0]["id"]
            assert http.post("/admin/testing/stall", params={"seconds": 5}).status_code == 200

            stalled = wait_for(lambda: (r := ready(server)).status_code == 503 and r, timeout=10)
            body = stalled.json()
            assert body["reason"] == "stalled"
            assert "no progress" in body["detail"] and request_id in body["detail"]
            assert http.get("/health").status_code == 200  # alive, only not ready
            assert metric(http, STALLS) == 1
            log = server.log()
            assert "engine stalled" in log and request_id in log

            wait_for(lambda: ready(server).status_code == 200, timeout=20)
            assert metric(http, STALLS) == 1  # once per stall, not once per check
            assert "engine progressing again" in server.log()
            events = stream.events()
            assert events[-1] == "[DONE]"
            assert events[-2]["usage"]["completion_tokens"] == 300
    finally:
        server.stop()


def test_sigterm_drains_in_flight_requests_then_exits_cleanly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM: /ready turns 503 at once and new requests get 503 while the stream in flight
    (held up by a stall, so it surely is) finishes complete; then exit 0, WAL folded back.
    Draining outranks stalled as the reason /ready gives."""
    server = ServerProcess(
        tiny_model_dir,
        tmp_path,
        ["--admin-token", TOKEN, "--drain-timeout-s", "60", "--stall-timeout-s", "1"],
        {"SERVEDECK_TESTING": "1"},
    )
    server.start()
    proc = server.proc
    assert proc is not None
    try:
        with server.client(headers=ADMIN) as http:
            stream = Stream(server, max_tokens=120)
            wait_for(lambda: state(http)["queue"]["running"] == 1)
            assert http.post("/admin/testing/stall", params={"seconds": 5}).status_code == 200
            wait_for(lambda: ready(server).json().get("reason") == "stalled", timeout=10)
            proc.send_signal(signal.SIGTERM)  # the stream has about 4 s of stall left

            draining = wait_for(lambda: (r := ready(server)).status_code == 503 and r, timeout=5)
            assert draining.json()["reason"] == "draining"
            refused = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503
            assert refused.json()["error"]["message"] == "the server is shutting down"
            assert refused.headers["retry-after"] == "5"
            admin = http.get("/admin/state")
            assert (admin.status_code, admin.json()) == (
                503,
                {"detail": "the server is shutting down"},
            )
            assert http.get("/health").status_code == 200
            assert stream.thread.is_alive()  # still streaming while we were refused

            events = stream.events()
            assert stream.status == 200
            assert events[-1] == "[DONE]"
            assert events[-2]["usage"]["completion_tokens"] == 120
            assert events[-3]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(60) == 0
    finally:
        server.stop()
    with pytest.raises(httpx.TransportError):
        ready(server)
    wal = server.db.with_name(server.db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    with sqlite3.connect(server.db) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert "SIGTERM: draining" in server.log()


def test_a_drain_that_times_out_ends_every_request_cleanly_with_engine_stopped(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 23, defect 4: at the drain deadline every stream still open gets the
    ``engine_stopped`` error event and ``[DONE]`` in a complete chunked body, a whole answer
    a 503 ``engine_stopped``; the log says so in one line, without a traceback, and the
    server exits 0 at once. The requests are held in flight by a stall past the deadline
    (so none can finish first), which also shows the cut-off does not wait for the step."""
    server = ServerProcess(
        tiny_model_dir,
        tmp_path,
        ["--admin-token", TOKEN, "--drain-timeout-s", "1", "--num-kv-blocks", "512"],
        {"SERVEDECK_TESTING": "1"},
    )
    server.start()
    proc = server.proc
    assert proc is not None
    try:
        with server.client(headers=ADMIN) as http:
            streams = [Stream(server, max_tokens=1000) for _ in range(4)]
            whole = Stream(server, max_tokens=1000, stream=False)
            wait_for(lambda: state(http)["queue"]["running"] == 5)
            # The stall starts within a step and outlasts the drain's 1 s.
            assert http.post("/admin/testing/stall", params={"seconds": 4}).status_code == 200
            proc.send_signal(signal.SIGTERM)
            for stream in streams:
                events = stream.events(timeout=15)
                assert stream.error is None, stream.error  # no incomplete chunked read
                assert stream.status == 200
                assert events[-1] == "[DONE]"
                error = events[-2]["error"]
                assert (error["code"], error["type"]) == ("engine_stopped", "server_error")
                assert "drain timeout of 1 s" in error["message"]
            whole.thread.join(15)
            assert (whole.error, whole.status) == (None, 503)
            assert json.loads("".join(whole.lines))["error"]["code"] == "engine_stopped"
        assert proc.wait(15) == 0
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log
    cut = [line for line in log.splitlines() if "cut off" in line]
    assert len(cut) == 1 and "5 request(s)" in cut[0], cut
