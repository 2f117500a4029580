"""``/openapi.json`` says what the server's validation does, including the limits that come
from its settings and its model: the stop list's bounds, a batch's size, and the token ids
the model has.

FastAPI builds the schema from the static models once and caches it; this writes the
server's own figures into that cached copy. While the model loads, the vocabulary is not known
yet: the schema is then not cached, and built again on the next request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

STOP_BODIES = ("CompletionRequest", "ChatCompletionRequest")
"""Request bodies with a ``stop`` list that ``check_stop_list`` bounds."""


# Any in this module: the OpenAPI document, JSON
def document_stop_limits(schema: dict[str, Any], max_strings: int, max_length: int) -> None:
    """``maxItems``/``maxLength`` of every ``stop`` in ``STOP_BODIES`` (what
    ``check_stop_list`` enforces), in place."""
    for body in STOP_BODIES:
        stop = schema["components"]["schemas"][body]["properties"]["stop"]
        for branch in stop["anyOf"]:
            if branch.get("type") == "string":
                branch["maxLength"] = max_length
            elif branch.get("type") == "array":
                branch["maxItems"] = max_strings
                branch["items"]["maxLength"] = max_length


def document_vocab_size(schema: dict[str, Any], vocab_size: int) -> None:
    """``maximum`` of the token ids in ``CompletionRequest.prompt``, one prompt's or a batch's
    (the engine refuses an id outside the vocabulary), in place."""
    for branch in _completion_request(schema)["prompt"]["anyOf"]:
        items = branch.get("items", {})
        if items.get("type") == "array":
            items = items["items"]
        if items.get("type") == "integer":
            items["maximum"] = vocab_size - 1


def document_batch_size(schema: dict[str, Any], max_prompts: int) -> None:
    """``maxItems`` of a batch of prompts in ``CompletionRequest.prompt`` (what
    ``check_batch_size`` enforces), in place: the lists of texts and of token-id lists."""
    for branch in _completion_request(schema)["prompt"]["anyOf"]:
        if branch.get("items", {}).get("type") in ("string", "array"):
            branch["maxItems"] = max_prompts


def _completion_request(schema: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    return properties


def document_limits(
    app: FastAPI,
    max_strings: int,
    max_length: int,
    max_prompts: int,
    vocab_size: Callable[[], int | None],
) -> None:
    """Make ``app.openapi()`` carry the stop-list bounds, the batch's and, once
    ``vocab_size()`` knows it, the vocabulary size."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()  # FastAPI caches it in app.openapi_schema
        document_stop_limits(schema, max_strings, max_length)
        document_batch_size(schema, max_prompts)
        vocab = vocab_size()
        if vocab is not None:
            document_vocab_size(schema, vocab)
        else:
            app.openapi_schema = None  # build it again once the model is loaded
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
