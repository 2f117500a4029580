"""The public API against a real server: completions equal offline greedy output, streaming,
refusals, and a client that goes away."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.control.support import ADMIN, ServerProcess, set_settings, sse_events, state, wait_for

PROMPTS: list[str | list[int]] = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog and",
    [5, 17, 300, 42, 7, 1999, 64],
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def offline_llm(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=256, num_threads=1)


@pytest.fixture(scope="module")
def offline(offline_llm: LLM) -> list[RequestOutput]:
    return offline_llm.generate(PROMPTS, greedy())


def greedy(**extra) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, **extra)


def completion(prompt: str | list[int], **extra) -> dict:
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_completion_equals_offline_greedy_output(
    client: httpx.Client, offline: list[RequestOutput], index: int
) -> None:
    response = client.post("/v1/completions", json=completion(PROMPTS[index], model="tiny"))
    assert response.status_code == 200, response.text
    body = response.json()
    expected = offline[index]
    assert body["object"] == "text_completion"
    assert body["model"] == "tiny"
    assert body["choices"][0]["text"] == expected.text
    assert body["choices"][0]["finish_reason"] == expected.finish_reason
    usage = body["usage"]
    cached = usage.pop("prompt_tokens_details")["cached_tokens"]
    assert usage == {
        "prompt_tokens": len(expected.prompt_token_ids),
        "completion_tokens": len(expected.token_ids),
        "total_tokens": len(expected.prompt_token_ids) + len(expected.token_ids),
    }
    assert 0 <= cached < len(expected.prompt_token_ids)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_streamed_completion_equals_offline_greedy_output(
    client: httpx.Client, offline: list[RequestOutput], index: int
) -> None:
    body = completion(PROMPTS[index], stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(list(response.iter_lines()))
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk, _ = events
    expected = offline[index]
    assert len({c["id"] for c in events[:-1]}) == 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected.text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == expected.finish_reason
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == len(expected.token_ids)
    assert usage_chunk["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)


def test_stream_without_include_usage_sends_no_usage(client: httpx.Client) -> None:
    with client.stream("POST", "/v1/completions", json=completion("Hi", stream=True)) as r:
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    assert all(e["usage"] is None and len(e["choices"]) == 1 for e in events[:-1])


def test_stop_string_ends_the_text_like_offline(
    client: httpx.Client, offline: list[RequestOutput], offline_llm: LLM
) -> None:
    stop = offline[1].text[4:7]
    [expected] = offline_llm.generate(PROMPTS[1], greedy(stop=[stop]))
    response = client.post("/v1/completions", json=completion(PROMPTS[1], stop=[stop]))
    choice = response.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (expected.text, "stop")
    assert choice["stop_reason"] == stop
    assert len(choice["text"]) < len(offline[1].text)


def test_seeded_sampling_is_reproducible(client: httpx.Client) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 1234}
    first = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    second = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert first == second


def test_unknown_model_is_404(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json=completion("Hi", model="gpt-9"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert "gpt-9" in error["message"]
    assert (error["param"], error["code"]) == ("model", "model_not_found")


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("temperature", -1), ("top_p", 0), ("prompt", ""), ("prompt", ["a", 1])],
)
def test_invalid_request_is_400_naming_the_field(client: httpx.Client, field: str, value) -> None:
    response = client.post("/v1/completions", json={**completion("Hi"), field: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", field)


def test_prompt_that_can_never_fit_the_pool_is_400(client: httpx.Client) -> None:
    set_settings(client, memory_reserve=0.1)
    kv = state(client)["kv"]
    admissible = kv["total"] - kv["reserved"]
    too_long = list(range(10, 10 + admissible * kv["block_size"]))
    response = client.post("/v1/completions", json=completion(too_long))
    assert response.status_code == 400
    detail = response.json()["error"]["message"]
    assert response.json()["error"]["param"] == "prompt"
    assert "KV pool" in detail
    assert f"{admissible} blocks" in detail


def test_prompt_over_max_model_len_is_400(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json=completion(list(range(5, 2100))))
    assert response.status_code == 400
    assert "max_model_len" in response.json()["error"]["message"]


def test_models_lists_the_served_model(client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in body["data"]] == [
        ("tiny", "model", "servedeck")
    ]


def test_health_reports_model_policy_version_and_job(client: httpx.Client) -> None:
    body = client.get("/health").json()
    assert body["status"] == "ok"
    assert body["model"] == "tiny"
    assert body["policy"] == state(client)["scheduler"]["policy"]
    assert body["version"] == client.get("/admin/policy", headers=ADMIN).json()["version"]
    assert body["reclaim_job_on_time"] is True


async def test_disconnect_mid_stream_aborts_and_frees_blocks(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    before = state(client)["totals"]["generation_tokens"]
    body = {
        "prompt": list(range(2500, 2600)),
        "max_tokens": 1500,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    async with (
        main_server.async_client() as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        received = 0
        async for line in response.aiter_lines():
            received += line.startswith("data: ")
            if received == 3:
                break  # leaving the block closes the connection mid-stream

    def released() -> dict | None:
        snap = state(client)
        return snap if not snap["requests"] and snap["kv"]["used"] == 0 else None

    snap = wait_for(released, timeout=20)
    assert snap["totals"]["generation_tokens"] - before < 1500


def test_disconnect_before_a_plain_response_aborts_and_frees_blocks(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    before = state(client)["totals"]["generation_tokens"]
    body = {"prompt": list(range(2700, 2800)), "max_tokens": 1500, "ignore_eos": True}
    with main_server.client(timeout=1.0) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body)  # hangs up after one second

    def released() -> dict | None:
        snap = state(client)
        return snap if not snap["requests"] and snap["kv"]["used"] == 0 else None

    snap = wait_for(released, timeout=20)
    assert snap["totals"]["generation_tokens"] - before < 1500
