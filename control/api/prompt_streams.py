"""The prompts of one answer: a batch's prompts are requests of their own (one stream each,
admitted together), answered as one, with each prompt's ``n`` choices numbered from its
``offset``; a single prompt is the batch of one. Their streams are read as one (``merged``),
their last outputs kept by prompt and choice (``Finals``), and their usage summed (``usage``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from control.schemas.completions import Usage
from control.service.protocol import EngineStream
from engine.outputs import RequestOutput

Choice = TypeVar("Choice", bound=BaseModel)

Finals = dict[tuple[int, int], RequestOutput]
"""The last output of each choice, by (prompt, the choice's index among its prompt's)."""


Choice_co = TypeVar("Choice_co", bound=BaseModel, covariant=True)


class ChoiceRender(Protocol[Choice_co]):
    """A prompt's choices: a sequence's whole choice from its last output, or chunk by chunk
    (the next chunk of an output's choice, or None), numbered ``index`` in the answer."""

    # Any: the whole answer's choice model (a completion's or a chat's), not the chunk's
    def final(self, output: RequestOutput, index: int) -> Any: ...

    def chunk(self, output: RequestOutput, index: int) -> Choice_co | None: ...


@dataclass(frozen=True, slots=True)
class PromptStream(Generic[Choice]):
    """One prompt of an answer: its engine stream, its choices' render, and the index of its
    first choice in the answer (prompt ``i`` of a batch with ``n`` choices each: ``i × n``,
    as OpenAI and vLLM number them)."""

    stream: EngineStream
    render: ChoiceRender[Choice]
    offset: int = 0


async def admitted(prompts: Sequence[PromptStream[Choice]]) -> None:
    """Once every prompt's engine took it. A batch is admitted whole: a refusal raises from
    the first stream awaited; then, or when the client went away meanwhile, every stream is
    closed, so that none of its prompts stays queued."""
    try:
        for part in prompts:
            await part.stream.admitted()
    except BaseException:
        for part in prompts:
            await part.stream.aclose()
        raise


async def merged(
    streams: Sequence[EngineStream],
) -> AsyncGenerator[tuple[int, RequestOutput]]:
    """The outputs of several prompts' streams as they come, each with its prompt's place.
    Closing this early cancels the reads still waiting (a cancelled read aborts its request)."""
    if len(streams) == 1:  # the common case, without a task per output
        async for output in streams[0]:
            yield 0, output
        return
    reads = {asyncio.ensure_future(stream.__anext__()): i for i, stream in enumerate(streams)}
    try:
        while reads:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            for read in sorted(done, key=reads.__getitem__):
                prompt = reads.pop(read)
                try:
                    output = read.result()
                except StopAsyncIteration:
                    continue
                reads[asyncio.ensure_future(streams[prompt].__anext__())] = prompt
                yield prompt, output
    finally:
        for read in reads:
            if not read.cancel() and not read.cancelled():
                read.exception()  # read, so that a failure after the answer ended is not logged


async def finals(streams: Sequence[EngineStream]) -> Finals:
    """The last output of each of the prompts' sequences."""
    last: Finals = {}
    async for prompt, output in merged(streams):
        last[prompt, output.index] = output
    return last


def usage(last: Finals) -> Usage:
    """Each prompt's tokens once, every choice's tokens. A prompt's cached tokens are counted
    once too, from its first choice: the sequence that computed the prompt (the others fork
    from it after its prefill and carry its count)."""
    firsts: dict[int, RequestOutput] = {}
    for (prompt, _), output in sorted(last.items(), key=lambda item: item[0]):
        firsts.setdefault(prompt, output)
    prompt_tokens = sum(len(output.prompt_token_ids) for output in firsts.values())
    cached = sum(output.metrics.num_cached_tokens for output in firsts.values())
    completion = sum(len(output.token_ids) for output in last.values())
    return Usage.of(prompt_tokens, completion, cached)
