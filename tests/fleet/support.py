"""Helpers of the fleet tests: which replica served a request, read from ``/admin/state``."""

from __future__ import annotations

from typing import Any

import httpx

from tests.control.support import state, wait_for
from tests.fleet.conftest import REPLICAS


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
