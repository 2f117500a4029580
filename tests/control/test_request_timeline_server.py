"""``GET /admin/requests/{id}/timeline`` (issue 41) against the shared server, started without
``--expose-text``: the timeline holds no text, so it needs none."""

from __future__ import annotations

import itertools
from urllib.parse import quote

import httpx

from tests.control.support import ADMIN, state


def timeline(http: httpx.Client, seq_id: str, headers: dict[str, str] = ADMIN) -> httpx.Response:
    return http.get(f"/admin/requests/{quote(seq_id, safe='')}/timeline", headers=headers)


def check_covered(found: dict) -> None:
    """Contiguous segments from the arrival, the events from arrived to finished."""
    segments = found["segments"]
    assert segments[0]["start"] == found["arrival_time"]
    for before, after in itertools.pairwise(segments):
        assert before["end"] == after["start"]
    assert [e["kind"] for e in found["events"]][:: len(found["events"]) - 1] == [
        "arrived",
        "finished",
    ]
    assert segments[-1]["end"] == found["events"][-1]["time"]


def test_a_finished_completion_has_its_timeline_and_each_fork_its_own(client: httpx.Client):
    answer = client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3, "n": 2})
    assert answer.status_code == 200, answer.text
    request_id = answer.json()["id"]
    response = timeline(client, request_id)
    assert response.status_code == 200, response.text
    found = response.json()
    assert found["seq_id"] == request_id and found["finished"] is True
    check_covered(found)
    phases = [s["phase"] for s in found["segments"]]
    assert "prefill" in phases and phases[-1] == "decode"
    assert "prompt" not in response.text and "a b c" not in response.text
    assert state(client)["text_exposed"] is False  # no --expose-text needed
    [fork] = found["forks"]
    assert fork["seq_id"] == f"{request_id}#1"
    check_covered(fork)
    assert timeline(client, fork["seq_id"]).json() == fork


def test_an_unknown_request_is_404(client: httpx.Client):
    response = timeline(client, "cmpl-nobody")
    assert response.status_code == 404
    assert "cmpl-nobody" in response.json()["detail"]


def test_the_timeline_needs_the_admin_token(client: httpx.Client):
    assert timeline(client, "cmpl-x", headers={}).status_code == 401
    assert timeline(client, "cmpl-x", {"Authorization": "Bearer wrong"}).status_code == 403
