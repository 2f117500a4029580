"""Limits a completion request meets before it reaches the engine, each cheap and each a 400
naming the field: the size of the stop list, the number of prompts in a batch, a text prompt
that cannot fit in ``max_model_len`` whatever it tokenizes to (the engine's own check,
``EngineFront.tokenize``), run with the tokenization off the event loop, and the request's
whole cost (``RequestCost``: its tokens and its logprob entries, summed over its prompts and
choices).

The engine repeats its own checks on the token ids (``max_model_len``, the KV pool,
``max_tokens``): these only refuse early what it would refuse anyway, without the cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from control.api.errors import ApiError
from engine.errors import RequestRejected
from engine.front import EngineFront, Prompt

REQUEST_TOO_LARGE = "request_too_large"
"""``error.code`` of a request past ``max_request_tokens`` or ``max_logprob_entries``."""


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


def check_batch_size(prompts: int, max_prompts: int) -> None:
    """A batch's prompts are each a request: bound how many one body may queue (before any is
    tokenized). Its tokens and logprob entries are bounded whole by ``check_request_cost``."""
    if prompts > max_prompts:
        raise RequestRejected(
            f"prompt is a batch of {prompts} prompts; at most {max_prompts} are allowed "
            "(max_batch_prompts)",
            "prompt",
        )


async def prompt_token_ids(prompts: Sequence[Prompt], front: EngineFront) -> list[list[int]]:
    """Token ids of each prompt for ``EngineService.add_requests``: text is measured (400 when
    it cannot fit, naming which prompt of a batch) and tokenized by the engine on a worker
    thread, so no request stalls the others."""
    if not any(isinstance(prompt, str) for prompt in prompts):
        return [list(prompt) for prompt in prompts if not isinstance(prompt, str)]  # all of them
    return await run_in_threadpool(_tokenize, prompts, front)


def _tokenize(prompts: Sequence[Prompt], front: EngineFront) -> list[list[int]]:
    token_ids = []
    for index, prompt in enumerate(prompts):
        try:
            token_ids.append(front.tokenize(prompt))
        except RequestRejected as exc:
            raise exc.in_batch(index, len(prompts)) from None
    return token_ids


@dataclass(frozen=True, slots=True)
class RequestCost:
    """What one request asks of the server, summed over its prompts (a batch counts whole)
    and its ``n`` choices of each: the tokens its sequences may hold,
    ``Σ n × (prompt + max_tokens)``, and the logprob entries its answer may carry,
    ``Σ n × (echoed prompt + max_tokens) × (top_logprobs + 1)`` (none without logprobs)."""

    n: int
    prompt_tokens: int
    """Σ over the prompts of their lengths."""
    max_tokens: int
    """Per choice (each prompt's choices may each generate this many)."""
    top_logprobs: int | None
    echo: bool
    tokens: int
    logprob_entries: int
    longest: int
    """The longest sequence asked for: the longest prompt + ``max_tokens``."""

    @classmethod
    def of(
        cls,
        prompt_lengths: Sequence[int],
        n: int,
        max_tokens: int,
        top_logprobs: int | None,
        echo: bool = False,
    ) -> RequestCost:
        prompts = sum(prompt_lengths)
        outputs = len(prompt_lengths) * max_tokens
        tokens = n * (prompts + outputs)
        entries = 0
        if top_logprobs is not None:
            entries = n * ((prompts if echo else 0) + outputs) * (top_logprobs + 1)
        longest = max(prompt_lengths, default=0) + max_tokens
        return cls(n, prompts, max_tokens, top_logprobs, echo, tokens, entries, longest)


@dataclass(frozen=True, slots=True)
class CostFields:
    """The fields a refusal names: the output limit, and the logprobs count."""

    tokens: str = "max_tokens"
    logprobs: str = "logprobs"


def check_request_cost(
    cost: RequestCost,
    max_request_tokens: int,
    max_logprob_entries: int,
    max_model_len: int,
    fields: CostFields = CostFields(),
) -> None:
    """A 400 (``request_too_large``) for a request past either bound, naming the output limit
    (tokens) or the logprobs count (entries). The token bound is never below one whole context:
    one sequence that fits ``max_model_len`` is the engine's to admit; what this bounds is the
    work multiplied by ``n`` and by batched prompts."""
    if cost.longest > max_model_len:
        return  # the engine's admission refuses it, naming the context (context_length_exceeded)
    token_bound = max(max_request_tokens, max_model_len)
    if cost.tokens > token_bound:
        raise ApiError(
            400,
            f"{fields.tokens}: this request would hold {cost.tokens:,} tokens, n × (prompt + "
            f"{fields.tokens}) = {cost.n} × ({cost.prompt_tokens:,} + {cost.max_tokens:,} per "
            f"prompt); at most {token_bound:,} are allowed (max_request_tokens): lower "
            f"{fields.tokens} or n",
            param=fields.tokens,
            code=REQUEST_TOO_LARGE,
            reason="too_large",
        )
    if cost.logprob_entries > max_logprob_entries:
        echoed = ("echoed prompt + ", f"{cost.prompt_tokens:,} + ") if cost.echo else ("", "")
        raise ApiError(
            400,
            f"{fields.logprobs}: this request would answer {cost.logprob_entries:,} logprob "
            f"entries, n × ({echoed[0]}{fields.tokens}) × ({fields.logprobs} + 1) = {cost.n} × "
            f"({echoed[1]}{cost.max_tokens:,} per prompt) × {(cost.top_logprobs or 0) + 1}; at "
            f"most {max_logprob_entries:,} are allowed (max_logprob_entries): lower "
            f"{fields.logprobs}, {fields.tokens} or n" + (", or drop echo" if cost.echo else ""),
            param=fields.logprobs,
            code=REQUEST_TOO_LARGE,
            reason="too_large",
        )
