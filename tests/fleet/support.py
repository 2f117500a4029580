"""Helpers of the fleet tests: which replica served a request, read from ``/admin/state``."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.control.support import ADMIN, wait_for
from tests.fleet.conftest import REPLICAS

# How long a fleet's state is read again while no replica answers its report in time.
STATE_RETRY_S = 30.0


def state(http: httpx.Client) -> dict[str, Any]:
    """The fleet's ``/admin/state``. On a loaded machine every replica's report can run past its
    2 s (``control/fleet/fleet.py`` ``REPORT_TIMEOUT_S``), and the fleet answers 503 "the engine
    did not answer in time" with a ``Retry-After``: read again, as it asks, for up to 30 s."""
    deadline = time.monotonic() + STATE_RETRY_S
    while True:
        response = http.get("/admin/state", headers=ADMIN)
        timed_out = response.status_code == 503 and "did not answer in time" in response.text
        if timed_out and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        assert response.status_code == 200, response.text
        return response.json()


def replicas(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {r["replica"]: r for r in state(http)["replicas"]}


def all_up(http: httpx.Client, timeout: float = 15.0) -> dict[str, dict[str, Any]]:
    """The replicas from a state where every one of them answered (on a loaded machine a
    replica's state call can run past its 2 s: it is then listed as not up, with zeros)."""

    def every() -> dict[str, dict[str, Any]] | None:
        now = replicas(http)
        return now if len(now) == REPLICAS and all(r["up"] for r in now.values()) else None

    return wait_for(every, timeout, 0.1)


def generated(http: httpx.Client) -> dict[str, int]:
    return {rid: r["generation_tokens"] for rid, r in all_up(http).items()}


def complete(http: httpx.Client, prompt: Any, max_tokens: int = 4) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def served_by(http: httpx.Client, prompt: list[int]) -> str:
    """The replica whose generated-token count grew by this request's 4 tokens."""
    before = generated(http)
    complete(http, prompt)
    after = generated(http)
    (replica,) = [rid for rid in after if after[rid] - before.get(rid, 0) == 4]
    return replica
