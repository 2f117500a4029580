"""What the load generator (``bench.load``) sends and how it reads the answer's event stream.

Two kinds of request, one way of timing them. Token-id prompts (``/v1/completions``) have the
exact lengths asked for and ``ignore_eos``, so a run is the load it says it is. Chat requests
(``/v1/chat/completions``, from a ``ChatPrompts`` set) are real conversations: the answer ends
where the model ends it (at most the conversation's ``max_tokens``) and the prompt's length is
the server's to say (its usage chunk), since only the server renders the chat template.

Both stream with ``include_usage``. A chunk with choices is one token's text, except a chat
stream's first chunk, whose delta names the assistant's role (sent before any token, as
OpenAI does; later deltas have ``role: null``) and is not counted; the usage chunk has no
choices.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import httpx

from bench.chat_prompts import DemoConversation
from sim.trace import TraceRequest

TOKEN_IDS = (10, 250)
"""Prompt token ids are drawn from this range: inside every vocabulary we serve."""
STREAM_OPTIONS = {"include_usage": True}


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """One request to send: its route, its JSON body and, when known before it is sent, its
    prompt's length in tokens (None: the usage chunk says)."""

    path: str
    body: dict[str, object]
    prompt_tokens: int | None


def token_request(model: str, request: TraceRequest, rng: random.Random) -> LoadRequest:
    """Random token ids of the trace request's prompt length, held to its decode length."""
    body: dict[str, object] = {
        "model": model,
        "prompt": [rng.randint(*TOKEN_IDS) for _ in range(request.num_prefill_tokens)],
        "max_tokens": request.num_decode_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": STREAM_OPTIONS,
    }
    return LoadRequest("/v1/completions", body, request.num_prefill_tokens)


def chat_request(model: str, conversation: DemoConversation, temperature: float) -> LoadRequest:
    body: dict[str, object] = {
        "model": model,
        "messages": [message.model_dump() for message in conversation.messages],
        "max_tokens": conversation.max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": STREAM_OPTIONS,
    }
    return LoadRequest("/v1/chat/completions", body, None)


def carries_token(event: dict[str, Any]) -> bool:
    """A chunk of generated text (see the module's docstring for what is not)."""
    choices = event.get("choices")
    if not choices:
        return False
    return not all((choice.get("delta") or {}).get("role") for choice in choices)


def prompt_tokens_of(event: dict[str, Any]) -> int | None:
    """The prompt's length from a usage chunk, None from any other."""
    usage = event.get("usage")
    return usage.get("prompt_tokens") if isinstance(usage, dict) else None


async def first_model(http: httpx.AsyncClient) -> str:
    response = await http.get("/v1/models")
    response.raise_for_status()
    model: str = response.json()["data"][0]["id"]
    return model


async def events(response: httpx.Response) -> AsyncGenerator[dict[str, Any], None]:
    """The stream's JSON events. Lines are split at ``\\n`` here (an SSE line ends there, or
    at ``\\r``): httpx's ``aiter_lines`` also splits at U+2028, U+0085 and the rest of
    ``str.splitlines``'s separators, which a real model's text holds unescaped in the JSON."""
    pending = ""
    async for text in response.aiter_text():
        *lines, pending = (pending + text).split("\n")
        for line in lines:
            if (event := _event(line)) is not None:
                yield event
    if (event := _event(pending)) is not None:
        yield event


def _event(line: str) -> dict[str, Any] | None:
    line = line.removesuffix("\r")
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    event: dict[str, Any] = json.loads(line[6:])
    return event
