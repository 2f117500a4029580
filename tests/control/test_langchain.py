"""LangChain's ``ChatOpenAI`` against a real server (issue 28), unmodified: its
``with_structured_output`` (a pydantic model as a strict ``json_schema``, the default method,
and as a forced tool call) returns a validated instance, ``bind_tools`` with a named
``tool_choice`` and with ``"required"`` gives an ``AIMessage`` whose ``tool_calls`` name the tool
with arguments valid against its schema, and a round trip (the tool run, its ``ToolMessage``
sent back) gets a final answer. On the tiny Qwen2 checkpoint with Qwen's tool template (random
weights: the grammar makes every answer valid, whatever the model says).

LangChain is a test dependency only (the dev extra). tiktoken comes with langchain-openai, for
token counting alone: the tests make sure nothing here asks it for an encoding (it would
download one)."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import pytest
import tiktoken
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.control.support import ServerProcess


class City(BaseModel):
    """A city and its population."""

    model_config = ConfigDict(extra="forbid")  # no extra keys: the answer stays short
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=10**8)


class WeatherQuery(BaseModel):
    city: str = Field(max_length=12, description="The city's name.")
    unit: Literal["celsius", "fahrenheit"]


@tool(args_schema=WeatherQuery)
def get_weather(city: str, unit: str) -> str:
    """The current weather in a city."""
    return json.dumps({"city": city, "temperature": 21, "unit": unit})


WEATHER_SCHEMA = WeatherQuery.model_json_schema()
QUESTION = [HumanMessage("What is the weather in Paris?")]


@pytest.fixture(autouse=True)
def offline_langchain(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tracing to LangSmith, and no tiktoken encoding (each would go to the internet)."""
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGSMITH_API_KEY"):
        monkeypatch.delenv(name, raising=False)

    def no_encoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("tiktoken asked for an encoding")

    monkeypatch.setattr(tiktoken, "get_encoding", no_encoding)
    monkeypatch.setattr(tiktoken, "encoding_for_model", no_encoding)


def chat_model(server: ServerProcess, max_tokens: int = 80) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        model="m",
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"method": "json_schema", "strict": True}, {"method": "function_calling"}],
    ids=["default", "json_schema-strict", "function_calling"],
)
def test_with_structured_output_returns_the_validated_model(
    qwen: ServerProcess, options: dict[str, Any]
) -> None:
    structured = chat_model(qwen).with_structured_output(City, include_raw=True, **options)
    answer = structured.invoke("The largest city in France, as JSON.")
    assert isinstance(answer, dict)
    assert answer["parsing_error"] is None, answer
    assert isinstance(answer["parsed"], City)
    if options.get("method") == "function_calling":
        assert [call["name"] for call in answer["raw"].tool_calls] == ["City"]


@pytest.mark.parametrize("tool_choice", ["get_weather", "required", "any"])
def test_bind_tools_with_a_forced_choice_calls_the_tool(
    qwen: ServerProcess, tool_choice: str
) -> None:
    model = chat_model(qwen).bind_tools(
        [get_weather], tool_choice=tool_choice, strict=True, parallel_tool_calls=False
    )
    answer = model.invoke(QUESTION)
    assert isinstance(answer, AIMessage)
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    assert not answer.invalid_tool_calls
    [call] = answer.tool_calls
    assert call["name"] == "get_weather"
    assert call["id"] and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER_SCHEMA)


def test_a_round_trip_sends_the_tool_message_back_for_a_final_answer(
    qwen: ServerProcess,
) -> None:
    model = chat_model(qwen).bind_tools(
        [get_weather], tool_choice="required", strict=True, parallel_tool_calls=False
    )
    first = model.invoke(QUESTION)
    assert isinstance(first, AIMessage) and len(first.tool_calls) == 1
    result = get_weather.invoke(first.tool_calls[0])  # the tool run: a ToolMessage
    assert isinstance(result, ToolMessage)
    assert result.tool_call_id == first.tool_calls[0]["id"]
    final = (
        chat_model(qwen, max_tokens=8).bind_tools([get_weather]).invoke([*QUESTION, first, result])
    )
    assert isinstance(final, AIMessage)
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    assert final.content or final.tool_calls
