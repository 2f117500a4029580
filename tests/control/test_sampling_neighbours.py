"""Issue 11, defect 1, against a real server: sampling params the schema accepts, however
extreme, are served, and never fail or change the request running beside them."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.control.support import ServerProcess

LONG = {"prompt": list(range(40, 240)), "max_tokens": 800, "ignore_eos": True, "temperature": 0}
EXTREMES = [
    {"temperature": 1e-45},
    {"temperature": 5e-324},
    {"top_p": 1e-300},
    {"temperature": 2.0, "top_p": 5e-324, "top_k": 1},
    {"temperature": 2.0, "top_k": -1, "seed": -(2**53)},
]


def stream_text(lines) -> tuple[str, str | None]:
    text, finish = "", None
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: ") :])
        assert "error" not in event, event
        for choice in event["choices"]:
            text += choice["text"]
            finish = choice["finish_reason"] or finish
    return text, finish


def test_extreme_sampling_params_are_served_and_leave_the_neighbour_alone(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    alone = client.post("/v1/completions", json=LONG)
    assert alone.status_code == 200, alone.text
    with (
        main_server.client() as http,
        http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as neighbour,
    ):
        assert neighbour.status_code == 200
        lines = neighbour.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        for extreme in EXTREMES:
            response = client.post(
                "/v1/completions", json={"prompt": "Hi", "max_tokens": 4, **extreme}
            )
            assert response.status_code == 200, (extreme, response.text)
            assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")
        text, finish = stream_text([first, *lines])
    assert finish == "length"
    assert text == alone.json()["choices"][0]["text"]


@pytest.mark.parametrize("extreme", [{"temperature": 1e-45}, {"top_p": 1e-300}])
def test_tiny_temperature_or_top_p_is_greedy(client: httpx.Client, extreme: dict) -> None:
    body = {"prompt": "The batching policy", "max_tokens": 12, "ignore_eos": True}
    greedy = client.post("/v1/completions", json={**body, "temperature": 0})
    tiny = client.post("/v1/completions", json={**body, **extreme})
    assert tiny.status_code == greedy.status_code == 200
    # A temperature under the greedy threshold is greedy; a top-p this small keeps exactly the
    # most likely token.
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
