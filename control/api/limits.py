"""Limits a completion request meets before it reaches the engine, each cheap and each a 400
naming the field: the size of the stop list, and a text prompt that cannot fit in
``max_model_len`` whatever it tokenizes to (the engine's own check, ``LLMEngine.tokenize``), run
with the tokenization off the event loop.

The engine repeats its own checks on the token ids (``max_model_len``, the KV pool,
``max_tokens``): these only refuse early what it would refuse anyway, without the cost.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from engine.engine import LLMEngine
from engine.errors import RequestRejected


def check_stop_list(stops: list[str], max_strings: int, max_length: int) -> None:
    """Every stop string is searched for after every token: bound how many, and how long
    each (so their total is bounded too)."""
    if len(stops) > max_strings:
        raise RequestRejected(
            f"stop has {len(stops)} strings; at most {max_strings} are allowed", "stop"
        )
    longest = max((len(stop) for stop in stops), default=0)
    if longest > max_length:
        raise RequestRejected(
            f"a stop string has {longest} characters; at most {max_length} are allowed", "stop"
        )


async def prompt_token_ids(prompt: str | list[int], engine: LLMEngine) -> list[int]:
    """Token ids for ``engine.add_request``: a text prompt is measured (400 when it cannot fit)
    and tokenized by the engine on a worker thread, so no request stalls the others."""
    if not isinstance(prompt, str):
        return prompt
    return await run_in_threadpool(engine.tokenize, prompt)
