"""The engine's per-token log-probabilities (``engine.outputs.TokenLogprob``) as the OpenAI
answers write them. The completions route uses ``completion_logprobs``; the chat route maps
``logprobs: true, top_logprobs: N`` onto ``SamplingParams(logprobs=N)`` and renders the same
entries with ``TokenTexts`` (token text and UTF-8 bytes) in its own shape.

Each token is decoded alone, as vLLM does: a token that holds part of a character reads as
U+FFFD, and the texts of a choice's tokens need not add up to its text exactly.
``text_offset`` accumulates those token texts from 0, in a stream as in one answer, so both
give the same numbers. A log-probability of ``-inf`` (a token the model rules out) is written
as ``LOGPROB_FLOOR``: JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tokenizers import Tokenizer

from control.schemas.completions import CompletionLogprobs
from engine.outputs import TokenLogprob

LOGPROB_FLOOR = -9999.0
"""What ``-inf`` is written as (vLLM's floor)."""


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


class TokenTexts:
    """Token ids as text, decoded one by one and remembered (one per request or stream)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def utf8(self, token_id: int) -> list[int]:
        """The token's text as UTF-8 bytes (chat's ``bytes``)."""
        return list(self(token_id).encode("utf-8"))


def completion_logprobs(
    entries: Iterable[TokenLogprob],
    texts: TokenTexts,
    offset: int = 0,
    first_token: int | None = None,
) -> tuple[CompletionLogprobs, int]:
    """The ``logprobs`` of a completion choice (or of one streamed chunk of it) and the text
    offset after its last token (where the next chunk's start). ``first_token``: an echoed
    prompt's first token, listed first with no logprob (nothing predicts it)."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    if first_token is not None:
        text = texts(first_token)
        out.tokens.append(text)
        out.token_logprobs.append(None)
        out.top_logprobs.append(None)
        out.text_offset.append(offset)
        offset += len(text)
    for entry in entries:
        text = texts(entry.token_id)
        out.tokens.append(text)
        out.token_logprobs.append(finite(entry.logprob))
        top = {texts(token_id): finite(logprob) for token_id, logprob in entry.top}
        top.setdefault(text, finite(entry.logprob))  # OpenAI: the chosen token is always in
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(text)
    return out, offset
