"""``response_format`` -> the engine's grammar constraint (engine/grammar.py), for both
generation routes.

A schema is bounded before anything compiles it (``MAX_SCHEMA_BYTES`` of JSON,
``MAX_SCHEMA_DEPTH`` levels of nesting), then compiled once on a worker thread, off the event
loop (llguidance drops the GIL while it compiles; its parser limits, ``grammar_limits``, bound
the work, so a compile ends with a grammar or a refusal, never runs on); the engine's
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
from control.schemas.response_format import ResponseFormat
from engine.front import EngineFront
from engine.grammar import GrammarError, json_object_grammar, json_schema_grammar
from engine.sampling_params import GrammarConstraint

MAX_SCHEMA_BYTES = 32 * 1024
"""A schema's JSON text, at most (OpenAI's own limits are of the same order)."""
MAX_SCHEMA_DEPTH = 32
"""Levels of objects and arrays in a schema's JSON, at most."""
SCHEMA_FIELD = "response_format.json_schema.schema"
INVALID_SCHEMA = "invalid_json_schema"
"""``error.code`` of a schema refused (bounds, or what the grammar library refuses)."""


async def constraint_of(
    response_format: ResponseFormat | None, front: EngineFront
) -> GrammarConstraint | None:
    """The request's constraint (None for none or ``text``), compiled; ``ApiError`` 400
    naming the field where it cannot be."""
    if response_format is None or response_format.type == "text":
        return None
    grammars = front.grammars
    if grammars is None:
        raise _refusal(
            "response_format needs the model's tokenizer, and this model has none",
            "response_format",
            "unsupported_value",
        )
    if response_format.type == "json_object":
        constraint, field = json_object_grammar(), "response_format"
    else:
        spec = response_format.json_schema
        if spec is None:
            raise _refusal(
                "response_format.json_schema is required with type json_schema",
                "response_format.json_schema",
                "invalid_value",
            )
        schema = {} if spec.schema_ is None else spec.schema_
        check_schema(schema)
        try:
            constraint = json_schema_grammar(schema)
        except GrammarError as exc:
            raise _refusal(f"{SCHEMA_FIELD}: {exc}", SCHEMA_FIELD, INVALID_SCHEMA) from None
        field = SCHEMA_FIELD
    if not grammars.is_compiled(constraint):
        try:
            await run_in_threadpool(grammars.compile, constraint)
        except GrammarError as exc:
            raise _refusal(f"{field}: {exc}", field, INVALID_SCHEMA) from None
    return constraint


def check_schema(schema: dict[str, Any]) -> None:
    """A schema within ``MAX_SCHEMA_BYTES`` and ``MAX_SCHEMA_DEPTH``, with no ``x-guidance``
    (llguidance's own options, which would override the server's: whitespace, leniency)."""
    size = len(json.dumps(schema).encode())
    if size > MAX_SCHEMA_BYTES:
        raise _refusal(
            f"{SCHEMA_FIELD} is {size} bytes of JSON; at most {MAX_SCHEMA_BYTES} are allowed",
            SCHEMA_FIELD,
            INVALID_SCHEMA,
        )
    if (depth := nesting(schema)) > MAX_SCHEMA_DEPTH:
        raise _refusal(
            f"{SCHEMA_FIELD} nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are allowed",
            SCHEMA_FIELD,
            INVALID_SCHEMA,
        )
    if "x-guidance" in schema:
        raise _refusal(
            f"{SCHEMA_FIELD}.x-guidance is not supported (the server sets the grammar's options)",
            f"{SCHEMA_FIELD}.x-guidance",
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


def _refusal(message: str, param: str, code: str) -> ApiError:
    return ApiError(400, message, param=param, code=code, reason="invalid")
