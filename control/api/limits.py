"""Limits a completion request meets before it reaches the engine, each cheap and each a 400
naming the field: the size of the stop list, and a text prompt that cannot fit in
``max_model_len`` whatever it tokenizes to. Then the prompt is tokenized off the event loop.

The engine repeats its own checks on the token ids (``max_model_len``, the KV pool,
``max_tokens``): these only refuse early what it would refuse anyway, without the cost.
"""

from __future__ import annotations

import threading
import weakref

from starlette.concurrency import run_in_threadpool
from tokenizers import Tokenizer

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


def longest_token_bytes(tokenizer: Tokenizer) -> int:
    """An upper bound on the UTF-8 bytes of text one token stands for: its longest vocabulary
    entry (byte-level entries spell one byte per character; SentencePiece's '▁' takes three
    bytes for one space, and '<0x41>' six for one byte, so entries never undercount)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max((len(token.encode("utf-8")) for token in vocab), default=1)


_max_prompt_bytes: weakref.WeakKeyDictionary[LLMEngine, int | None] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def max_prompt_bytes(engine: LLMEngine) -> int | None:
    """Text longer than this (UTF-8 bytes) cannot fit ``max_model_len`` tokens; None without
    a tokenizer. Computed once per engine (the server warms it right after loading)."""
    with _lock:
        if engine not in _max_prompt_bytes:
            tokenizer = engine.tokenizer
            _max_prompt_bytes[engine] = (
                None
                if tokenizer is None
                else engine.limits.max_model_len * longest_token_bytes(tokenizer)
            )
        return _max_prompt_bytes[engine]


async def prompt_token_ids(prompt: str | list[int], engine: LLMEngine) -> list[int]:
    """Token ids for ``engine.add_request``; a text prompt is measured first (400 when it
    cannot fit), then tokenized on a worker thread so no request stalls the others."""
    if not isinstance(prompt, str):
        return prompt
    bound = max_prompt_bytes(engine)
    if bound is not None:
        size = len(prompt.encode("utf-8"))
        if size > bound:
            raise RequestRejected(
                f"prompt is {size} bytes of text, more than max_model_len "
                f"({engine.limits.max_model_len}) tokens can hold",
                "prompt",
            )
    return await run_in_threadpool(_encode, engine, prompt)


def _encode(engine: LLMEngine, text: str) -> list[int]:
    if engine.tokenizer is None:
        return engine.tokenize(text)  # the engine's own refusal
    # encode_batch releases the GIL while it works (encode does not), so the event loop
    # keeps answering meanwhile; the ids equal engine.tokenize's.
    return engine.tokenizer.encode_batch([text])[0].ids
