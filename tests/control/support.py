"""Helpers of the control-plane tests: a real ``servedeck serve`` child process on a free port
of 127.0.0.1 (the tiny checkpoint, a SQLite file of its own) and small HTTP helpers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.child_server import free_port

TOKEN = "test-admin-token-4d1f0c"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
NUM_KV_BLOCKS = 128


class ServerProcess:
    """One ``servedeck serve`` child; ``restart`` keeps the database and the port."""

    def __init__(
        self, model_dir: Path, workdir: Path, args: list[str], env: dict[str, str]
    ) -> None:
        self.model_dir = model_dir
        self.workdir = workdir
        self.db = workdir / "servedeck.db"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.env = env
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, extra_args: list[str] | None = None) -> None:
        argv = [
            sys.executable, "-m", "control.cli", "serve",
            "--model", str(self.model_dir),
            "--port", str(self.port),
            "--db", str(self.db),
            "--num-threads", "1",
            "--num-kv-blocks", str(NUM_KV_BLOCKS),
            "--log-level", "info",
            *self.args,
            *(extra_args or []),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
        env |= {"SERVEDECK_HOME": str(self.workdir), "TOKENIZERS_PARALLELISM": "false"}
        env |= self.env
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                argv, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until ``GET /ready`` answers 200 (model loaded, engine loop running). A server that
        is not ready in time is stopped before the test fails: left running, it (and the Ray
        instance it may have started) would load the machine for the rest of the suite."""
        try:
            self._poll_ready()
        except BaseException:
            self.stop()
            raise

    def _poll_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                response = httpx.get(f"{self.url}/ready", timeout=2.0)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if response.status_code == 200:
                return
            time.sleep(0.05)
        pytest.fail(f"server not ready after {START_TIMEOUT_S} s:\n{self.log()[-4000:]}")

    def stop(self) -> int:
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait()

    def restart(self, extra_args: list[str] | None = None) -> None:
        self.stop()
        self.start(extra_args)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 60.0, **kwargs})

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, **{"timeout": 60.0, **kwargs})


def set_settings(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    """PUT the given settings (with the current version as If-Match); returns the result."""
    current = http.get("/admin/policy", headers=ADMIN)
    assert current.status_code == 200, current.text
    response = http.put(
        "/admin/policy",
        json={"reason": "test set-up", **fields},
        headers={**ADMIN, "If-Match": current.headers["etag"]},
    )
    assert response.status_code == 200, response.text
    return response.json()


def state(http: httpx.Client) -> dict[str, Any]:
    response = http.get("/admin/state", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def sse_events(lines: list[str]) -> list[Any]:
    """``data:`` payloads of an SSE body: parsed JSON, or the literal ``[DONE]``."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def wait_for(predicate: Any, timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; return its value (fail after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)
