"""What OpenAI-compatible load testers send, byte for byte, is served as vLLM serves it.

The bodies are guidellm 0.8.1's (``guidellm run --backend kind=openai_http,...`` with its
defaults, synthetic data of 64 prompt and 32 output tokens), captured on their way to a real
``servedeck serve``; only ``model`` names this server's model. guidellm streams with
``stream_options: {include_usage, continuous_usage_stats}`` and reads the token counts from
the last ``usage`` it sees; it times the first token from the first chunk with text. Its
backend check is ``GET /health``, its model comes from ``GET /v1/models``'s first ``id``.
bench/openai_clients.py runs the client itself.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.control.support import sse_events

PROMPT = (
    "1 0 m0 Finish medical want almost away until. Its culture song reveal return finally "
    "affect.\nPush page seem quickly actually memory than. Them business subject"
)
OUTPUT_TOKENS = 32
GUIDELLM_CHAT = (
    '{"model":"small-seed0","stream":true,"stream_options":{"include_usage":true,'
    '"continuous_usage_stats":true},"max_completion_tokens":32,"ignore_eos":true,'
    '"messages":[{"role":"user","content":[{"type":"text","text":' + json.dumps(PROMPT) + "}]}]}"
)
GUIDELLM_COMPLETION = (
    '{"model":"small-seed0","stream":true,"stream_options":{"include_usage":true,'
    '"continuous_usage_stats":true},"max_tokens":32,"ignore_eos":true,"prompt":'
    + json.dumps(PROMPT)
    + "}"
)
SERVED = "tiny"
"""The shared test server's model name (tests/control/conftest.py)."""
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
BODIES = {"chat": GUIDELLM_CHAT, "completion": GUIDELLM_COMPLETION}


def as_sent(kind: str, **changes: Any) -> str:
    """guidellm's body, its model the served one; ``changes`` as its other modes send them
    (``stream=false`` drops ``stream`` and ``stream_options``)."""
    body = json.loads(BODIES[kind]) | {"model": SERVED}
    for key, value in changes.items():
        if value is None:
            body.pop(key)
        else:
            body[key] = value
    return json.dumps(body, separators=(",", ":"))


def streamed(client: httpx.Client, kind: str, content: str) -> list[Any]:
    with client.stream("POST", PATHS[kind], content=content, headers=HEADERS) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_events(list(response.iter_lines()))


def text_of(kind: str, choice: dict) -> str | None:
    return choice["delta"].get("content") if kind == "chat" else choice["text"]


def test_backend_check_and_model_are_what_guidellm_reads(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()["data"]
    assert [item["id"] for item in models] == [SERVED]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streamed_request_reports_usage_on_every_chunk_and_last(
    client: httpx.Client, kind: str
) -> None:
    events = streamed(client, kind, as_sent(kind))
    assert events[-1] == "[DONE]"
    *chunks, last, _ = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == OUTPUT_TOKENS
    prompt_tokens = last["usage"]["prompt_tokens"]
    assert last["usage"]["total_tokens"] == prompt_tokens + OUTPUT_TOKENS
    running = [chunk["usage"] for chunk in chunks]
    assert all(usage["prompt_tokens"] == prompt_tokens for usage in running)
    counts = [usage["completion_tokens"] for usage in running]
    assert counts == sorted(counts) and counts[-1] == OUTPUT_TOKENS
    assert all(u["total_tokens"] == prompt_tokens + u["completion_tokens"] for u in running)
    if kind == "chat":  # the role chunk first, before any token
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and counts[0] == 0
    texts = [text_of(kind, chunk["choices"][0]) for chunk in chunks]
    assert "".join(t or "" for t in texts)  # what guidellm counts as its stream's tokens


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_without_continuous_stats_only_the_last_chunk_has_usage(
    client: httpx.Client, kind: str
) -> None:
    events = streamed(client, kind, as_sent(kind, stream_options={"include_usage": True}))
    *chunks, last, _ = events
    assert all(chunk["usage"] is None for chunk in chunks)
    assert last["usage"]["completion_tokens"] == OUTPUT_TOKENS


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_whole_request_reports_usage(client: httpx.Client, kind: str) -> None:
    """guidellm's ``stream=false`` mode: the same body without ``stream``/``stream_options``."""
    content = as_sent(kind, stream=None, stream_options=None)
    response = client.post(PATHS[kind], content=content, headers=HEADERS)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["usage"]["completion_tokens"] == OUTPUT_TOKENS
    assert answer["choices"][0]["finish_reason"] == "length"


def test_continuous_usage_counts_each_choice_on_its_own(client: httpx.Client) -> None:
    """With ``n`` choices a chunk's usage is its own choice's tokens so far (as vLLM counts);
    the last chunk's usage all of them."""
    body = as_sent("completion", n=2, max_tokens=5)
    *chunks, last, _ = streamed(client, "completion", body)
    seen: dict[int, list[int]] = {0: [], 1: []}
    for chunk in chunks:
        seen[chunk["choices"][0]["index"]].append(chunk["usage"]["completion_tokens"])
    assert seen == {0: [1, 2, 3, 4, 5], 1: [1, 2, 3, 4, 5]}
    assert last["usage"]["completion_tokens"] == 10
