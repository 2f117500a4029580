"""How the load generator reads a stream: events split at ``\\n`` only (a model's text may hold
U+2028 or U+0085 raw in its JSON, where httpx's ``aiter_lines`` would cut the line), whatever
the network's chunking; a chat stream's role chunk and the usage chunk are not tokens."""

from __future__ import annotations

import asyncio
import json

import httpx

from bench.load_requests import carries_token, events, prompt_tokens_of

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
TEXT = {"choices": [{"index": 0, "delta": {"role": None, "content": "a\u2028b\x85c\u2029"}}]}
COMPLETION = {"choices": [{"index": 0, "text": " word"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 37, "completion_tokens": 2}}


def read(body: bytes, chunk: int) -> list[dict]:
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    response = httpx.Response(200, stream=httpx.ByteStream(b""))
    response.stream = _Chunks(pieces)

    async def collect() -> list[dict]:
        return [event async for event in events(response)]

    return asyncio.run(collect())


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece


def test_events_split_at_newlines_only() -> None:
    sent = [ROLE, TEXT, COMPLETION, USAGE]
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in sent)
    body += "data: [DONE]\n\n"
    for chunk in (1, 7, 4096):  # a line cut anywhere, even inside a UTF-8 character
        assert read(body.encode(), chunk) == sent


def test_which_chunks_are_tokens() -> None:
    assert [carries_token(e) for e in (ROLE, TEXT, COMPLETION, USAGE)] == [
        False, True, True, False,
    ]  # fmt: skip
    assert [prompt_tokens_of(e) for e in (ROLE, USAGE)] == [None, 37]
