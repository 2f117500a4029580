"""A fleet under more load than its replicas' queues take (a real 2-replica server of its own
on the session's Ray instance: one running and one waiting request per replica, a 2 s drain):
every refusal is an HTTP 429 as the single-engine server gives it, never a 200 stream that
ends in an error; and a restart whose drain times out ends the request it cut with an error
naming the restart, never a hang (driven by ``servedeck fleet restart --wait``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.control.support import TOKEN, ServerProcess, sse_events
from tests.fleet.conftest import REPLICAS, fleet_server_process
from tests.fleet.support import all_up, state

if TYPE_CHECKING:
    from control.fleet.local_ray import RayAccess

DRAIN_TIMEOUT_S = 2.0
FLOOD = 24
LONG = 1900
"""Tokens of a stream the restart cuts (about 120 blocks of the 128 a replica has)."""


@pytest.fixture(scope="module")
def small_fleet(
    ray_instance: RayAccess, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = fleet_server_process(
        ray_instance,
        tiny_model_dir,
        tmp_path_factory.mktemp("small-fleet"),
        "--ray-app-name",
        "small-fleet",
        "--max-waiting",
        "1",
        "--max-num-seqs",
        "1",
        "--fleet-drain-timeout-s",
        str(DRAIN_TIMEOUT_S),
    )
    yield server
    server.stop()


def post_stream(
    url: str, max_tokens: int, out: list[Any], first: threading.Event | None = None
) -> None:
    """One streamed request; ``first`` is set once its first chunk arrived."""
    body = {"prompt": "flood", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if first is not None and line.startswith("data: {"):
                first.set()
        out.append((response.status_code, dict(response.headers), lines))


def in_parallel(url: str, n: int, max_tokens: int) -> list[Any]:
    out: list[Any] = []
    threads = [threading.Thread(target=post_stream, args=(url, max_tokens, out)) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(out) == n, "a request hung"
    return out


def errors(lines: list[str]) -> list[dict[str, Any]]:
    return [e for e in sse_events(lines) if isinstance(e, dict) and "error" in e]


def test_a_full_replica_queue_is_a_429_not_an_error_event(small_fleet: ServerProcess) -> None:
    answers = in_parallel(small_fleet.url, FLOOD, 16)
    refused = [a for a in answers if a[0] != 200]
    served = [a for a in answers if a[0] == 200]
    assert refused and served, [a[0] for a in answers]
    for status, headers, lines in refused:
        assert status == 429, lines
        body = httpx.Response(status, content="\n".join(lines).encode()).json()
        assert body["error"]["code"] == "queue_full", body
        assert body["error"]["type"] == "rate_limit_error"
        assert headers["retry-after"] == "1"
        assert headers["content-type"].startswith("application/json")
    for _, _, lines in served:
        assert not errors(lines), lines
        assert sse_events(lines)[-1] == "[DONE]"
    # Not streamed: the same 429.
    with small_fleet.client() as http:
        wholes: list[int] = []

        def whole() -> None:
            body = {"prompt": "flood", "max_tokens": 16, "ignore_eos": True}
            wholes.append(http.post("/v1/completions", json=body).status_code)

        threads = [threading.Thread(target=whole) for _ in range(FLOOD)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert set(wholes) == {200, 429}, wholes


def test_a_drain_past_its_timeout_ends_the_request_with_a_clear_error(
    small_fleet: ServerProcess,
) -> None:
    out: list[Any] = []
    threads = []
    with small_fleet.client() as http:
        # One stream per replica, each generating (which takes over 10 s) when the restart
        # starts: the second is sent once the first streams, so the router's count of
        # requests in flight puts it on the other replica. (Two sent at once could share
        # one, and then outlast no drain: the first replica drained had nothing to cut.)
        for _ in range(REPLICAS):
            first = threading.Event()
            threads.append(
                threading.Thread(target=post_stream, args=(small_fleet.url, LONG, out, first))
            )
            threads[-1].start()
            assert first.wait(30)
        assert [r["running"] for r in all_up(http).values()] == [1] * REPLICAS
        argv = ["fleet", "restart", "--wait", "--url", small_fleet.url, "--token", TOKEN]
        cli = subprocess.run(
            [sys.executable, "-m", "control.cli", *argv],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert cli.returncode == 0, cli.stderr
        assert "one at a time" in cli.stdout and "done: " in cli.stdout, cli.stdout
        for thread in threads:
            thread.join(60)
        assert len(out) == REPLICAS, "a stream hung past the drain timeout"
        cut = [errors(lines) for _, _, lines in out if errors(lines)]
        assert cut, [(len(sse_events(lines)), lines[-6:]) for _, _, lines in out]
        for (error,) in cut:
            assert error["error"]["code"] == "engine_stopped"
            assert "rolling restart" in error["error"]["message"], error
        # No wall-clock bound here: the error event is the proof that the deadline held (a
        # stream not cut runs to its last token with none), while the restart's own length
        # (two replica starts) ran past 60 s on a 2-core machine loaded five times over.
        done = state(http)["restart"]
        assert done["state"] == "done" and len(done["started"]) == REPLICAS, done
