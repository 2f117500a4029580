"""Crash safety of the policy store: ``kill -9`` in the middle of a stream of policy updates,
then a restart on the same database. The SQLite file passes its integrity check, the schema is
at the migrations' head, and the newest version — at least the last one a client saw
acknowledged — is the one in force."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from control.migrate import current_revision, head_revision
from tests.control.support import ADMIN, TOKEN, ServerProcess, state

ROUNDS = 3
CYCLE = ("static", "dynamic", "continuous", "hybrid")


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN], {})
    proc.start()
    yield proc
    proc.stop()


def hammer(url: str, stop: threading.Event, acknowledged: list[int]) -> None:
    """PUT policy changes as fast as the server takes them; record acknowledged versions."""
    turn = 0
    with httpx.Client(base_url=url, headers=ADMIN, timeout=10.0) as http:
        while not stop.is_set():
            body = {"policy": {"name": CYCLE[turn % 4]}, "reason": f"crash test {turn}"}
            turn += 1
            try:
                response = http.put("/admin/policy", json=body)
            except httpx.TransportError:
                return  # the server is gone
            if response.status_code == 200:
                acknowledged.append(response.json()["version"])


def test_kill_9_during_policy_updates_loses_no_acknowledged_version(server: ServerProcess):
    for _ in range(ROUNDS):
        acknowledged: list[int] = []
        stop = threading.Event()
        writer = threading.Thread(target=hammer, args=(server.url, stop, acknowledged))
        writer.start()
        deadline = time.monotonic() + 30
        while len(acknowledged) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.proc is not None
        server.proc.kill()  # SIGKILL: no shutdown code runs
        server.proc.wait()
        stop.set()
        writer.join(15)
        assert acknowledged, "no update was acknowledged before the kill"

        with sqlite3.connect(server.db) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        server.restart()
        assert current_revision(server.db) == head_revision()
        with server.client(headers=ADMIN) as http:
            view = http.get("/admin/policy").json()
            assert view["version"] >= acknowledged[-1]
            assert state(http)["policy"]["name"] == view["settings"]["policy"]["name"]
