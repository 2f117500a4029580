"""Admission limits: the requests the engine refuses at once because they can never be served
(empty, token ids outside the vocabulary, longer than ``max_model_len``, larger than the KV
pool above its reserve, text too long to fit whatever it tokenizes to). Each refusal names the
field to blame."""

from __future__ import annotations

from tokenizers import Tokenizer

from engine.config import EngineLimits
from engine.errors import RequestRejected
from engine.kv_budget import reserved_blocks
from engine.sampling_params import SamplingParams


def check_request(
    token_ids: list[int],
    params: SamplingParams,
    limits: EngineLimits,
    memory_reserve: float,
    vocab_size: int | None,
) -> None:
    """Raise ``RequestRejected`` (naming the field) for a request that can never be served:
    the pool is judged by its size above ``memory_reserve``, never by what it holds now."""
    if not token_ids:
        raise RequestRejected("prompt is empty", "prompt")
    max_len = limits.max_model_len
    if len(token_ids) >= max_len:  # before the scan below: a huge list is refused at once
        raise RequestRejected(
            f"prompt has {len(token_ids)} tokens; max_model_len is {max_len} "
            "(the prompt and at least one generated token must fit)",
            "prompt",
        )
    if vocab_size is not None and not all(0 <= t < vocab_size for t in token_ids):
        raise RequestRejected(f"prompt token ids must be in [0, {vocab_size})", "prompt")
    admissible = limits.num_kv_blocks - reserved_blocks(limits.num_kv_blocks, memory_reserve)
    if limits.blocks_for(len(token_ids) + 1) > admissible:
        raise RequestRejected(
            f"prompt has {len(token_ids)} tokens but the KV pool admits at most "
            f"{admissible * limits.block_size} ({admissible} blocks of "
            f"{limits.block_size} above the memory reserve)",
            "prompt",
        )
    if len(token_ids) + params.max_tokens > max_len:
        raise RequestRejected(
            f"max_tokens={params.max_tokens} with a prompt of {len(token_ids)} tokens asks "
            f"for {len(token_ids) + params.max_tokens} tokens; max_model_len is {max_len} "
            "(reduce the prompt or max_tokens)",
            "max_tokens",
        )


def max_prompt_bytes(tokenizer: Tokenizer, max_model_len: int) -> int:
    """Text longer than this (UTF-8 bytes) cannot fit ``max_model_len`` tokens, whatever it
    tokenizes to: no token stands for more bytes than the longest vocabulary entry spells
    (byte-level entries spell one byte per character; SentencePiece's '▁' takes three bytes for
    one space, and '<0x41>' six for one byte, so entries never undercount)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max_model_len * max((len(token.encode("utf-8")) for token in vocab), default=1)


def check_text_size(text: str, bound: int, max_model_len: int) -> None:
    """Refuse text that cannot fit before paying for its tokenization."""
    size = len(text.encode("utf-8"))
    if size > bound:
        raise RequestRejected(
            f"prompt is {size} bytes of text, more than max_model_len ({max_model_len}) "
            "tokens can hold",
            "prompt",
        )
