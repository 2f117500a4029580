"""The public API as a hostile client tries it, against a real server (issue 11, defects 2, 3
and 5 on /v1): every bad input is a 400 naming its field in OpenAI's error shape, limits are
enforced before the expensive part, and no request stalls the others."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.control.support import ADMIN

JSON = {"content-type": "application/json"}
MiB = 1024 * 1024

INVALID = [
    ('"prompt": "Hi", "temperature": NaN', "temperature"),
    ('"prompt": "Hi", "temperature": Infinity', "temperature"),
    ('"prompt": "Hi", "top_p": -Infinity', "top_p"),
    ('"prompt": "Hi", "top_p": NaN', "top_p"),
    ('"prompt": "Hi", "seed": 18446744073709551616', "seed"),
    ('"prompt": "a\\ud800b"', "prompt"),
    ('"prompt": "Hi", "stop": ["x\\udfffy"]', "stop"),
    ('"prompt": "Hi", "stop": "\\udfff"', "stop"),
    ('"prompt": [true, false]', "prompt"),
    ('"prompt": [1.5]', "prompt"),
    ('"prompt": ""', "prompt"),
    ('"prompt": []', "prompt"),
    ('"prompt": "Hi", "max_tokens": "5"', "max_tokens"),
    ('"prompt": "Hi", "max_tokens": 2.5', "max_tokens"),
    ('"prompt": "Hi", "top_k": true', "top_k"),
    ('"prompt": "Hi", "n": true', "n"),
    ('"prompt": "Hi", "n": 17', "n"),
    ('"prompt": "Hi", "stop": ""', "stop"),
    ('"prompt": "Hi", "stop": ["a", ""]', "stop"),
    ('"prompt": "Hi", "ignore_eos": 1', "ignore_eos"),
    ('"prompt": "Hi", "model": 5', "model"),
    ('"prompt": "Hi", "stream_options": {"include_usage": "yes"}', "stream_options.include_usage"),
]


def post_raw(http: httpx.Client, text: str | bytes, path: str = "/v1/completions", **kw):
    return http.post(path, content=text, headers={**JSON, **kw.pop("headers", {})}, **kw)


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert error["message"]
    return error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("fields", "param"), INVALID)
def test_invalid_value_is_400_naming_the_field(
    client: httpx.Client, fields: str, param: str, stream: bool
) -> None:
    response = post_raw(client, f'{{"stream": {json.dumps(stream)}, {fields}}}')
    error = assert_openai_error(response, 400, param)
    assert error["message"].startswith(param)


@pytest.mark.parametrize("fields", ['"stream": "yes"', '"stream": 1', '"stream": "true"'])
def test_stream_must_be_a_boolean(client: httpx.Client, fields: str) -> None:
    assert_openai_error(post_raw(client, f'{{"prompt": "Hi", {fields}}}'), 400, "stream")


def test_numbers_are_taken_as_json_schema_reads_them(client: httpx.Client) -> None:
    """A number may be written as an integer, and an integer as 3.0 (JSON Schema's rule)."""
    body = {"prompt": [5.0, 17], "max_tokens": 2.0, "temperature": 1, "top_p": 1, "n": 1.0}
    response = client.post("/v1/completions", json={**body, "seed": 2**53})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 2


def test_invalid_json_is_400_in_openai_shape(client: httpx.Client) -> None:
    error = assert_openai_error(post_raw(client, '{"prompt": "Hi",'), 400, None)
    assert "JSON" in error["message"]


def test_admin_422_renders_non_finite_numbers_and_surrogates(client: httpx.Client) -> None:
    body = '{"memory_reserve": NaN, "reclaim_interval_s": Infinity, "reason": "a\\ud800"}'
    response = client.put("/admin/policy?dry_run=true", content=body, headers={**ADMIN, **JSON})
    assert response.status_code == 422, response.text
    inputs = {e["loc"][-1]: e["input"] for e in response.json()["detail"]}
    assert inputs["memory_reserve"] == "nan"
    assert inputs["reclaim_interval_s"] == "inf"


def test_streamed_request_refused_before_its_first_token_gets_json(client: httpx.Client) -> None:
    too_long = {"prompt": list(range(5, 3000)), "stream": True}
    error = assert_openai_error(client.post("/v1/completions", json=too_long), 400, "prompt")
    assert error["code"] == "context_length_exceeded"
    past_context = {"prompt": "Hi", "max_tokens": 10**6, "stream": True}
    response = client.post("/v1/completions", json=past_context)
    assert assert_openai_error(response, 400, "max_tokens")["code"] == "context_length_exceeded"
    unknown = {"prompt": "Hi", "model": "gpt-9", "stream": True}
    assert_openai_error(client.post("/v1/completions", json=unknown), 404, "model")


def test_twenty_megabyte_body_is_413_before_it_is_read(client: httpx.Client) -> None:
    body = json.dumps({"prompt": "x" * (20 * MiB)})
    started = time.monotonic()
    response = post_raw(client, body)
    assert time.monotonic() - started < 3.0
    error = assert_openai_error(response, 413, None)
    assert error["code"] == "request_too_large"
    assert client.get("/health").status_code == 200


def test_body_without_length_is_counted_as_it_arrives(client: httpx.Client) -> None:
    def chunks():
        yield b'{"prompt": "'
        for _ in range(5):
            yield b"y" * MiB
        yield b'"}'

    response = client.post("/v1/completions", content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers
    assert_openai_error(response, 413, None)


def test_admin_body_too_large_keeps_the_admin_shape(client: httpx.Client) -> None:
    body = json.dumps({"reason": "r" * (5 * MiB)})
    response = client.put("/admin/policy", content=body, headers={**ADMIN, **JSON})
    assert response.status_code == 413
    assert "bytes" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/completions", "/admin/policy?dry_run=true"])
def test_deep_json_is_400_without_being_parsed(client: httpx.Client, path: str) -> None:
    depth = 200_000
    body = '{"prompt": ' + "[" * depth + "]" * depth + ', "reason": "r"}'
    started = time.monotonic()
    response = client.request(
        "PUT" if path.startswith("/admin") else "POST",
        path,
        content=body,
        headers={**JSON, **ADMIN},
    )
    assert time.monotonic() - started < 2.0
    assert response.status_code == 400
    payload = response.json()
    message = payload["error"]["message"] if path.startswith("/v1") else payload["detail"]
    assert "deeper than 64" in message


def test_moderate_nesting_and_brackets_in_strings_are_still_parsed(client: httpx.Client) -> None:
    """Brackets inside strings (after escaped quotes and backslashes too) do not nest."""
    in_string = '\\\\\\"' + "[{" * 100
    body = f'{{"prompt": "Hi", "max_tokens": 1, "stop": ["{in_string}"], "x_unknown": ' + "[" * 60
    body += "]" * 60 + "}"
    response = post_raw(client, body)
    assert response.status_code == 200, response.text


def test_unknown_v1_path_is_404_in_openai_shape(client: httpx.Client) -> None:
    assert_openai_error(client.post("/v1/embeddings", json={}), 404, None)
    assert_openai_error(client.get("/v1/completions"), 405, None)


def test_a_hundred_thousand_stop_strings_are_refused(client: httpx.Client) -> None:
    body = {"prompt": "Hi", "stop": [f"s{i}" for i in range(100_000)]}
    started = time.monotonic()
    error = assert_openai_error(client.post("/v1/completions", json=body), 400, "stop")
    assert time.monotonic() - started < 3.0
    assert "100000 strings" in error["message"]


def test_stop_list_bounds_count_and_length(client: httpx.Client) -> None:
    ok = {"prompt": "Hi", "max_tokens": 2, "stop": [f"stop{i}" for i in range(16)]}
    assert client.post("/v1/completions", json=ok).status_code == 200
    too_many = {**ok, "stop": [*ok["stop"], "one more"]}
    assert_openai_error(client.post("/v1/completions", json=too_many), 400, "stop")
    too_long = {**ok, "stop": ["z" * 257]}
    error = assert_openai_error(client.post("/v1/completions", json=too_long), 400, "stop")
    assert "257 characters" in error["message"]
    assert client.post("/v1/completions", json={**ok, "stop": "z" * 256}).status_code == 200


def probe_health(client: httpx.Client, seconds: float) -> float:
    """The slowest ``GET /health`` answer over ``seconds``."""
    slowest = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        assert client.get("/health").status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.02)
    return slowest


def test_text_that_cannot_fit_is_refused_before_tokenizing(client: httpx.Client) -> None:
    body = json.dumps({"prompt": "hello world, this is a text. " * (130_000)})
    assert len(body) < 4 * MiB
    with ThreadPoolExecutor(1) as pool:
        slowest = pool.submit(probe_health, client, 1.5)
        started = time.monotonic()
        error = assert_openai_error(post_raw(client, body), 400, "prompt")
        took = time.monotonic() - started
        assert slowest.result() < 0.5
    assert took < 1.5
    assert "max_model_len" in error["message"]
    assert error["code"] == "context_length_exceeded"


PROBE = {"n": 16, "logprobs": 20, "echo": True, "max_tokens": 200}
"""Issue 23's probe: a 15.7 MB answer to a 1,479-token prompt (n × 1,679 × 21 = 564,144
logprob entries); four such clients took 64 of 65 running sequences."""


def cost_refusal(response: httpx.Response, param: str) -> str:
    error = assert_openai_error(response, 400, param)
    assert error["code"] == "request_too_large"
    assert error["message"].startswith(param)
    return error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_probe_request_is_refused_by_the_logprob_bound(
    client: httpx.Client, stream: bool
) -> None:
    """Within the token bound (16 × 1,679 = 26,864 ≤ 32,768), past the logprob entries'."""
    prompt = [(7 * i) % 4000 + 5 for i in range(1479)]
    body = {"prompt": prompt, **PROBE, "stream": stream}
    message = cost_refusal(client.post("/v1/completions", json=body), "logprobs")
    assert "564,144 logprob entries" in message and "100,000" in message


def test_a_request_past_the_token_bound_names_max_tokens(client: httpx.Client) -> None:
    """n copies of a sequence that fits the context; one past the context is that refusal."""
    past_context = {"prompt": [5] * 100, "max_tokens": 10**6}
    refused = client.post("/v1/completions", json=past_context)
    error = assert_openai_error(refused, 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    body = {"prompt": [5] * 100, "n": 16, "max_tokens": 1900}  # 16 × 2,000 = 32,000
    message = cost_refusal(client.post("/v1/completions", json=body), "max_tokens")
    assert "32,000 tokens" in message and "30,000" in message  # the main server's bound


def test_chat_is_bounded_by_its_own_fields(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    body = {"messages": messages, "n": 16, "logprobs": True, "top_logprobs": 20}
    refused = client.post("/v1/chat/completions", json={**body, "max_tokens": 400})
    cost_refusal(refused, "top_logprobs")  # 16 × 400 × 21 = 134,400 entries
    longest = client.post("/v1/chat/completions", json={**body, "max_completion_tokens": 1900})
    cost_refusal(longest, "max_completion_tokens")  # 16 × (prompt + 1,900) > 30,000 tokens


def test_ordinary_requests_are_within_the_bounds(client: httpx.Client) -> None:
    """n, logprobs and echo together, n=16 with 20 logprobs on short output, and a chat
    with n and top_logprobs."""
    echo = {"prompt": [5] * 30, "n": 4, "logprobs": 5, "echo": True, "max_tokens": 8}
    short = {"prompt": "Hi", "n": 16, "logprobs": 20, "max_tokens": 4}
    for body in (echo, short):
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert len(response.json()["choices"]) == body["n"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2}
    response = client.post("/v1/chat/completions", json={**chat, "max_tokens": 4, "n": 2})
    assert response.status_code == 200, response.text
