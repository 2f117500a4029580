"""What an operator sees of /v1 requests, against a real server: every response echoes
``X-Request-Id``, the log lines carry it (and never the prompt), refused and failed requests
are counted, and ``/openapi.json`` declares every answer (issue 11)."""

from __future__ import annotations

import re
import threading
import uuid

import httpx
import pytest

from tests.control.support import ADMIN, ServerProcess, state, wait_for
from tests.control.test_hostile_inputs import assert_openai_error

GENERATED = re.compile(r"[0-9a-f]{32}")


def metric(http: httpx.Client, name: str, labels: str = "") -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def refused(http: httpx.Client, reason: str) -> float:
    return metric(http, "servedeck_requests_refused_total", f'{{reason="{reason}"}}')


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
        ("POST", "/v1/completions", {"prompt": "Hi", "temperature": -1}),
        ("POST", "/v1/completions", {"prompt": "Hi", "model": "nope"}),
        ("GET", "/v1/models", None),
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("GET", "/admin/state", None),
    ],
)
def test_every_response_echoes_a_sane_request_id(
    client: httpx.Client, method: str, path: str, body: dict | None
) -> None:
    given = f"trace-{uuid.uuid4()}:a.b_c"
    response = client.request(method, path, json=body, headers={**ADMIN, "X-Request-Id": given})
    assert response.headers["x-request-id"] == given


@pytest.mark.parametrize("given", [None, "has space", "x" * 129, "t\u00e9st", ""])
def test_a_missing_or_insane_request_id_is_replaced(
    client: httpx.Client, given: str | None
) -> None:
    headers = {} if given is None else {"X-Request-Id": given.encode()}
    first = client.get("/health", headers=headers).headers["x-request-id"]
    second = client.get("/health", headers=headers).headers["x-request-id"]
    assert GENERATED.fullmatch(first) and GENERATED.fullmatch(second)
    assert first != second


def test_log_lines_carry_the_request_id_and_never_the_prompt(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    marker = f"secret-prompt-{uuid.uuid4().hex}"
    ok_id, bad_id = f"ok-{uuid.uuid4().hex}", f"bad-{uuid.uuid4().hex}"
    body = {"prompt": f"{marker} tell me", "max_tokens": 2}
    ok = client.post("/v1/completions", json=body, headers={"X-Request-Id": ok_id})
    assert ok.status_code == 200
    bad = client.post(
        "/v1/completions", json={**body, "top_p": 7}, headers={"X-Request-Id": bad_id}
    )
    assert bad.status_code == 400
    wait_for(lambda: bad_id in main_server.log(), timeout=5)
    log = main_server.log()
    assert re.search(rf"POST /v1/completions 200 .*request_id={ok_id}", log)
    assert re.search(rf"POST /v1/completions 400 .*request_id={bad_id}", log)
    assert marker not in log


def test_refused_requests_are_counted_by_reason(client: httpx.Client) -> None:
    before = {r: refused(client, r) for r in ("invalid", "too_large", "unknown_model")}
    client.post("/v1/completions", json={"prompt": ""})
    client.post("/v1/completions", json={"prompt": "Hi", "stop": ["s"] * 1000})
    client.post("/v1/completions", content=b"x" * (5 * 1024 * 1024))
    client.post("/v1/completions", json={"prompt": "Hi", "model": "gpt-9"})
    after = {r: refused(client, r) for r in before}
    assert after["invalid"] - before["invalid"] == 2
    assert after["too_large"] - before["too_large"] == 1
    assert after["unknown_model"] - before["unknown_model"] == 1


def leak_when_running(client: httpx.Client) -> None:
    """Drop the one request in flight through the test-only route: its stream fails."""
    rows = wait_for(lambda: state(client)["requests"], timeout=20)
    response = client.post(f"/admin/testing/leak/{rows[0]['id']}", headers=ADMIN)
    assert response.status_code == 200, response.text
    client.post("/admin/reclaim", headers=ADMIN)


def test_a_request_that_fails_in_the_engine_is_a_500_and_counted(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    failed = metric(client, "servedeck_requests_failed_total")
    body = {"prompt": list(range(40, 140)), "max_tokens": 1500, "ignore_eos": True}
    leaker = threading.Thread(target=leak_when_running, args=(client,))
    leaker.start()
    with main_server.client() as http:
        response = http.post("/v1/completions", json=body)
    leaker.join()
    error = assert_openai_error(response, 500, None)
    assert error["code"] == "engine_error"
    assert metric(client, "servedeck_requests_failed_total") == failed + 1


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_is_counted(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    failed = metric(client, "servedeck_requests_failed_total")
    body = {"prompt": list(range(40, 140)), "max_tokens": 1500, "ignore_eos": True}
    with (
        main_server.client() as http,
        http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        leak_when_running(client)
        events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = httpx.Response(200, content=events[-2][len("data: ") :]).json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_error")
    assert metric(client, "servedeck_requests_failed_total") == failed + 1


def test_openapi_declares_every_public_answer(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    completions = spec["paths"]["/v1/completions"]["post"]["responses"]
    assert {"400", "401", "404", "413", "429", "500", "503"} <= set(completions)
    assert "422" not in completions
    for status in ("400", "401", "404", "413", "429", "500", "503"):
        schema = completions[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
    event = completions["200"]["content"]["text/event-stream"]["schema"]
    assert (event["type"], event["required"]) == ("object", ["data"])
    operations = [spec["paths"]["/v1/completions"]["post"], spec["paths"]["/v1/models"]["get"]]
    assert not any("security" in operation for operation in operations)  # the key is optional
    models = spec["paths"]["/v1/models"]["get"]["responses"]
    assert {"401", "500", "503"} <= set(models)
    request = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    text, tokens, texts, token_lists = request["prompt"]["anyOf"]
    assert (text["minLength"], tokens["minItems"], tokens["items"]["type"]) == (1, 1, "integer")
    assert (tokens["items"]["minimum"], tokens["items"]["maximum"]) == (0, 4095)  # tiny: 4096
    assert (texts["minItems"], texts["maxItems"], texts["items"]["minLength"]) == (1, 256, 1)
    each = token_lists["items"]
    assert (token_lists["minItems"], token_lists["maxItems"], each["minItems"]) == (1, 256, 1)
    assert (each["items"]["minimum"], each["items"]["maximum"]) == (0, 4095)
    assert request["stream"]["type"] == "boolean"
    one, many, _ = request["stop"]["anyOf"]
    assert (one["minLength"], one["maxLength"]) == (1, 256)
    assert (many["maxItems"], many["items"]["maxLength"], many["items"]["minLength"]) == (
        16,
        256,
        1,
    )


PYDANTIC_ONLY = {"gt", "ge", "lt", "le", "multiple_of"}


def misspelled_bounds(node: object, where: str = "") -> list[str]:
    """Where a schema states a bound by pydantic's name (``gt``) instead of JSON Schema's
    (``exclusiveMinimum``): a client, or a fuzzer, would read it as no bound at all."""
    found: list[str] = []
    if isinstance(node, dict):
        if "type" in node and PYDANTIC_ONLY & node.keys():
            found.append(where)
        for key, value in node.items():
            found += misspelled_bounds(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += misspelled_bounds(value, f"{where}/{i}")
    return found


def test_openapi_states_every_bound_as_json_schema_does(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    assert not misspelled_bounds(spec)
    weights = spec["components"]["schemas"]["FairQueue"]["properties"]["weights"]
    assert weights["additionalProperties"]["exclusiveMinimum"] == 0
