"""Where the waiting went (issue 41) in ``/metrics`` and ``/admin/state``, on the shared
server: the wait counter by reason (every reason of the vocabulary, so the label set is
bounded and known), the queue-time histogram, and the state's summary."""

from __future__ import annotations

import httpx

from engine.timeline import WaitReason
from tests.control.support import state


def samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_waiting_seconds_by_reason_and_the_queue_time_histogram(client: httpx.Client):
    before = samples(client.get("/metrics").text)
    completion = {"prompt": "Why wait?", "max_tokens": 3, "temperature": 0}
    assert client.post("/v1/completions", json=completion).status_code == 200
    text = client.get("/metrics").text
    after = samples(text)
    assert "# TYPE servedeck_request_wait_seconds_total counter" in text
    assert "# TYPE servedeck_request_queue_time_seconds histogram" in text
    for reason in WaitReason:
        name = f'servedeck_request_wait_seconds_total{{reason="{reason.value}"}}'
        assert after[name] >= before.get(name, 0.0) >= 0.0
    for cause in ("memory", "priority"):
        assert f'servedeck_preemptions_total{{cause="{cause}"}}' in after
    count = "servedeck_request_queue_time_seconds_count"
    assert after[count] == before[count] + 1


def test_the_state_says_where_the_waiting_went(client: httpx.Client):
    waits = state(client)["waits"]
    assert waits["window_s"] == 60.0
    reasons = {share["reason"] for share in waits["total"]}
    assert reasons <= {reason.value for reason in WaitReason}
    assert all(share["seconds"] >= 0 for share in waits["total"] + waits["recent"])
