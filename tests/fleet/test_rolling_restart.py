"""A rolling restart of the 2-replica fleet (a real server, real Ray Serve replicas): one
replica at a time drains and is replaced, streams running across it finish with all their
tokens, requests sent meanwhile all answer 200, and the new replicas run the version in force."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.control.support import (
    ADMIN,
    TOKEN,
    ServerProcess,
    set_settings,
    sse_events,
    wait_for,
)
from tests.fleet.conftest import REPLICAS
from tests.fleet.support import all_up, state

STREAM_TOKENS = 600


def stream(
    url: str, max_tokens: int, results: list[Any], ended: list[float], first: threading.Event
) -> None:
    """One streamed request; ``first`` is set once its first chunk arrived."""
    body = {"prompt": "across a restart", "max_tokens": max_tokens, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=180
    ) as response:
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            first.set()
        results.append((response.status_code, sse_events(lines)))
    ended.append(time.time())


def keep_asking(url: str, statuses: list[int], done: threading.Event) -> None:
    body = {"prompt": "meanwhile", "max_tokens": 2, "temperature": 0}
    with httpx.Client(base_url=url, timeout=60) as http:
        while not done.is_set():
            statuses.append(http.post("/v1/completions", json=body).status_code)
            time.sleep(0.05)


def on_version(http: httpx.Client, version: int) -> list[dict[str, Any]] | None:
    """Every replica, when there are ``REPLICAS`` and all are up on ``version``; else None."""
    replicas = state(http)["replicas"]
    ok = [r for r in replicas if r["up"] and r["version"] == version]
    return ok if len(ok) == len(replicas) == REPLICAS else None


def tokens_of(events: list[Any]) -> int:
    """Tokens of a completion stream: one chunk per token, the last one with its reason."""
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    return len(chunks)


def test_a_rolling_restart_drains_one_replica_at_a_time(
    fleet: httpx.Client, fleet_server: Any
) -> None:
    version = set_settings(fleet, policy={"name": "hybrid", "params": {}})["version"]
    ready = wait_for(  # every replica up on it (an earlier test may have killed one)
        lambda: on_version(fleet, version), 60, 0.2
    )
    before = {r["replica"]: r["pid"] for r in ready}
    assert len(before) == REPLICAS
    results: list[Any] = []
    ended: list[float] = []
    firsts = [threading.Event() for _ in range(REPLICAS)]
    streams = [
        threading.Thread(
            target=stream, args=(fleet_server.url, STREAM_TOKENS, results, ended, first)
        )
        for first in firsts
    ]
    for thread, first in zip(streams, firsts, strict=True):  # one after the other: the
        thread.start()  # router's count of requests in flight puts them on two replicas
        assert first.wait(30)  # generating (for 5 s or more)
    # ... both, in a state where each replica answered (a replica's state call that runs
    # past its 2 s on a loaded machine shows it down, with zeros)
    assert sum(r["running"] for r in all_up(fleet).values()) == REPLICAS

    response = fleet.post("/admin/fleet/restart", headers=ADMIN)
    assert response.status_code == 202, response.text
    restart = response.json()
    assert sorted(restart["replicas"]) == sorted(before) and restart["state"] == "running"
    assert restart["version"] == version
    again = fleet.post("/admin/fleet/restart", headers=ADMIN)
    # (a restart that ended at once shows why in its view and the server's log)
    assert again.status_code == 409 and "running" in again.json()["detail"], (
        again.text,
        fleet_server.log()[-6000:],
    )

    statuses: list[int] = []  # a short request after another during the restart
    done = threading.Event()
    meanwhile = threading.Thread(target=keep_asking, args=(fleet_server.url, statuses, done))
    meanwhile.start()
    # (old replicas routed to, new ones) at each poll: the router's list, not "answered its
    # state call" (on a loaded machine a serving replica's call can run past its 2 s)
    timeline: list[tuple[set[str], set[str]]] = []
    draining: set[str] = set()  # the replicas /admin/state showed draining
    new_views: list[dict[str, Any]] = []
    started = time.monotonic()
    finished: dict[str, Any] | None = None  # the first state after the restart ended
    try:
        while time.monotonic() - started < 150:
            now = state(fleet)
            up = {r["pid"] for r in now["replicas"] if r["up"]}
            # Never none listed; on a loaded machine a listed replica's state call may run
            # past its 2 s (then it is slow, not gone: the requests meanwhile all get a 200).
            assert now["replicas"], "no replica listed during the restart"
            slow = [r for r in now["replicas"] if "not answered yet" in (r["error"] or "")]
            assert up or slow, f"no replica up during the restart: {now['replicas']}"
            listed = {r["replica"] for r in now["replicas"]}
            timeline.append((listed & set(before), listed - set(before)))
            new_views += [r for r in now["replicas"] if r["up"] and r["replica"] not in before]
            draining |= {now["restart"]["draining"]} - {None}
            if now["restart"]["state"] != "running":
                finished = finished or now
                # Ray's deploy has returned with no old replica routed; the router's list may
                # show the second new replica a moment later: poll on until it does.
                if len(listed - set(before)) == REPLICAS:
                    break
            time.sleep(0.1)
    finally:
        done.set()
        meanwhile.join(60)
    assert len(statuses) >= 2 and set(statuses) == {200}, statuses
    assert finished is not None, "the restart did not end within 150 s"
    assert finished["restart"]["state"] == "done", finished["restart"]
    assert sorted(finished["restart"]["left"]) == sorted(before)
    assert draining and draining <= set(before), draining
    for thread in streams:
        thread.join(60)

    # Every stream ran to its last token: the draining replica finished it.
    assert len(results) == REPLICAS
    for status, events in results:
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        assert not [e for e in events if isinstance(e, dict) and "error" in e], events[-3:]
        assert tokens_of(events) == STREAM_TOKENS
    # ... and both were still running when the restart began (so one ran across a drain).
    assert min(ended) > restart["started_at"], (ended, restart)
    # One after the other, never none up: one old replica served while the first new one
    # started, then the first new one served while the second old one drained.
    news = [i for i, (_, new) in enumerate(timeline) if new]
    assert news and len(timeline[news[0]][1]) == 1, timeline
    assert any(len(old) == 1 and not new for old, new in timeline[: news[0]]), timeline
    assert any(len(new) == REPLICAS for _, new in timeline[news[0] :]), timeline
    assert all(not (old and len(new) == REPLICAS) for old, new in timeline), timeline
    after = wait_for(lambda: on_version(fleet, version), 10)
    assert len(after) == REPLICAS
    assert not {r["pid"] for r in after} & set(before.values())
    assert not set(r["replica"] for r in after) & set(before)
    # The new replicas came up on the version in force (from their first state on).
    assert {(r["version"], r["policy"]) for r in new_views} == {(version, "hybrid")}, new_views
    set_settings(fleet, policy={"name": "continuous", "params": {}})


@pytest.fixture
def single(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN], {})
    server.start()
    yield server
    server.stop()


def test_a_restart_needs_a_fleet_and_the_admin_token(single: ServerProcess) -> None:
    with single.client() as http:
        assert http.post("/admin/fleet/restart").status_code == 401
        refused = http.post("/admin/fleet/restart", headers=ADMIN)
        assert refused.status_code == 409 and "--replicas" in refused.json()["detail"]
        assert state(http)["restart"] is None
