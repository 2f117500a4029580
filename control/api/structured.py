"""``response_format`` (or vLLM's ``structured_outputs``) -> the engine's grammar constraint
(engine/grammar.py), for both generation routes.

A schema is bounded before anything compiles it (``MAX_SCHEMA_BYTES`` of JSON,
``MAX_SCHEMA_DEPTH`` levels of nesting), then compiled once, off the event loop: first in a
worker process killed past ``COMPILE_TIMEOUT_S`` (engine/grammar_check.py: a compile that runs
on is stopped, and refused), then in the server on a worker thread (llguidance drops the GIL;
its parser limits, ``grammar_limits``, bound the work); the engine's
``Grammars`` keeps the compiled grammars by the grammar's hash in a bounded LRU, so a schema
seen before costs a lookup. Every refusal is a 400 naming the field
(``response_format.json_schema.schema``) with llguidance's reason (``Unimplemented keys:
["uniqueItems"]``).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool

from control.api.errors import ApiError
from control.schemas.response_format import ResponseFormat, StructuredOutputs
from engine.front import EngineFront
from engine.grammar import (
    GrammarError,
    Grammars,
    choice_grammar,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)
from engine.sampling_params import GrammarConstraint

MAX_SCHEMA_BYTES = 32 * 1024
"""A schema's JSON text, at most (OpenAI's own limits are of the same order)."""
MAX_SCHEMA_DEPTH = 32
"""Levels of objects and arrays in a schema's JSON, at most."""
COMPILE_TIMEOUT_S = 5.0
"""A grammar's first compile, at most (in a worker process killed past it:
engine/grammar_check.py); a JSON schema's takes about a millisecond."""
SCHEMA_FIELD = "response_format.json_schema.schema"
INVALID_SCHEMA = "invalid_json_schema"
"""``error.code`` of a schema refused (bounds, or what the grammar library refuses)."""
INVALID_GRAMMAR = "invalid_grammar"
"""``error.code`` of a ``structured_outputs`` regex, choice list or grammar the library
refuses."""
CONFLICTING = "conflicting_constraints"
"""``error.code`` of a request with both ``response_format`` and ``structured_outputs``."""


async def constraint_of(
    response_format: ResponseFormat | None,
    structured_outputs: StructuredOutputs | None,
    front: EngineFront,
) -> GrammarConstraint | None:
    """The request's constraint (None for none, ``text`` or an empty ``structured_outputs``),
    compiled; ``ApiError`` 400 naming the field where it cannot be."""
    formatted = response_format is not None and response_format.type != "text"
    structured = structured_outputs is not None and any(
        value is not None
        for value in (
            structured_outputs.json_,
            structured_outputs.regex,
            structured_outputs.choice,
            structured_outputs.grammar,
        )
    )
    if not (formatted or structured):
        return None
    if formatted and structured:
        raise refusal(
            "structured_outputs and response_format both constrain the answer: give one",
            "structured_outputs",
            CONFLICTING,
        )
    field = "response_format" if formatted else "structured_outputs"
    grammars = front.grammars
    if grammars is None:
        raise refusal(
            f"{field} needs the model's tokenizer, and this model has none",
            field,
            "unsupported_value",
        )
    if structured_outputs is not None and structured:
        constraint, field, code = _structured(structured_outputs)
    else:
        assert response_format is not None
        constraint, field = _formatted(response_format)
        code = INVALID_SCHEMA
    await compiled(grammars, constraint, field, code)
    return constraint


async def compiled(
    grammars: Grammars, constraint: GrammarConstraint, field: str, code: str
) -> None:
    """``constraint`` compiled (a lookup when it was before), off the event loop; a 400
    naming ``field`` with llguidance's reason where it cannot be."""
    if not grammars.is_compiled(constraint):
        try:
            await run_in_threadpool(grammars.compile, constraint, COMPILE_TIMEOUT_S)
        except GrammarError as exc:
            raise refusal(f"{field}: {exc}", field, code) from None


def _structured(spec: StructuredOutputs) -> tuple[GrammarConstraint, str, str]:
    """vLLM's ``structured_outputs``: the constraint, its field and the code of its refusal."""
    if spec.json_ is not None:
        field = "structured_outputs.json"
        check_schema(spec.json_, field)
        return schema_grammar(spec.json_, field), field, INVALID_SCHEMA
    if spec.regex is not None:
        return regex_grammar(spec.regex), "structured_outputs.regex", INVALID_GRAMMAR
    if spec.grammar is not None:
        field = "structured_outputs.grammar"
        return lark_grammar(spec.grammar, "grammar"), field, INVALID_GRAMMAR
    assert spec.choice is not None
    return choice_grammar(spec.choice), "structured_outputs.choice", INVALID_GRAMMAR


# Any: a user's JSON Schema (and, in nesting, any JSON value)
def schema_grammar(schema: dict[str, Any], field: str) -> GrammarConstraint:
    try:
        return json_schema_grammar(schema)
    except GrammarError as exc:
        raise refusal(f"{field}: {exc}", field, INVALID_SCHEMA) from None


def _formatted(response_format: ResponseFormat) -> tuple[GrammarConstraint, str]:
    """OpenAI's ``response_format`` (json_object or json_schema): the constraint, its field."""
    if response_format.type == "json_object":
        return json_object_grammar(), "response_format"
    spec = response_format.json_schema
    if spec is None:
        raise refusal(
            "response_format.json_schema is required with type json_schema",
            "response_format.json_schema",
            "invalid_value",
        )
    schema = {} if spec.schema_ is None else spec.schema_
    check_schema(schema, SCHEMA_FIELD)
    return schema_grammar(schema, SCHEMA_FIELD), SCHEMA_FIELD


def check_schema(schema: dict[str, Any], field: str) -> None:
    """A schema within ``MAX_SCHEMA_BYTES`` and ``MAX_SCHEMA_DEPTH``, with no ``x-guidance``
    (llguidance's own options, which would override the server's: whitespace, leniency)."""
    size = len(json.dumps(schema).encode())
    if size > MAX_SCHEMA_BYTES:
        raise refusal(
            f"{field} is {size} bytes of JSON; at most {MAX_SCHEMA_BYTES} are allowed",
            field,
            INVALID_SCHEMA,
        )
    if (depth := nesting(schema)) > MAX_SCHEMA_DEPTH:
        raise refusal(
            f"{field} nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are allowed",
            field,
            INVALID_SCHEMA,
        )
    if "x-guidance" in schema:
        raise refusal(
            f"{field}.x-guidance is not supported (the server sets the grammar's options)",
            f"{field}.x-guidance",
            "unsupported_value",
        )


def nesting(value: Any) -> int:
    """Levels of objects and arrays in a JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def refusal(message: str, param: str, code: str) -> ApiError:
    return ApiError(400, message, param=param, code=code, reason="invalid")
