"""What ``/v1/completions`` and ``/v1/chat/completions`` share: the first checks (model, stop
list), the engine's sampling params, and the answer: whole once every choice is done (a client
that hangs up first aborts the request), or as server-sent events (each choice's chunks, the
usage chunk, an error event, ``[DONE]``), with the usage counted once.

An answer is over one or more prompts (``PromptStream``: a batch's prompts are requests of
their own), each with its ``n`` choices, numbered from its ``offset``; one prompt is the batch
of one. Each route keeps what differs: its body, its prompts and its choices (a
``ChoiceRender``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from control.api.errors import ApiError, public_errors
from control.api.limits import check_stop_list
from control.api.middleware import CLIENT_GONE
from control.api.prompt_streams import Choice, Finals, PromptStream, admitted, finals, merged, usage
from control.core.config import Settings
from control.runtime import Runtime
from control.schemas.completions import StreamOptions, Usage
from control.schemas.errors import ErrorInfo, ErrorResponse
from control.service.protocol import EngineStream
from engine.errors import EngineStepError, EngineStopped
from engine.outputs import RequestOutput
from engine.sampling_params import GrammarConstraint, SamplingParams

DISCONNECT_POLL_S = 0.25
"""How often a client waiting for a whole answer is checked for having hung up."""
T = TypeVar("T")


def check_model(model: str | None, served: str) -> None:
    """A request may name the served model or none; another name answers 404."""
    if model is not None and model != served:
        raise ApiError(
            404,
            f"model {model!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
            reason="unknown_model",
        )


@dataclass(frozen=True)
class StreamUsage:
    """The usage a stream carries (``stream_options``): with ``include_usage`` a last chunk
    with no choices and the whole request's usage; with vLLM's ``continuous_usage_stats`` as
    well, every chunk its choice's usage so far (the role chunks none yet), as vLLM sends it
    and load testers such as guidellm ask for it."""

    final: bool
    continuous: bool
    prompt_tokens: int
    """The prompt's tokens, for the chunks sent before any output (chat's roles)."""

    @classmethod
    def of(cls, options: StreamOptions | None, prompt_tokens: int) -> StreamUsage:
        final = options is not None and options.include_usage
        continuous = final and options is not None and options.continuous_usage_stats
        return cls(final, continuous, prompt_tokens)

    def so_far(self, output: RequestOutput | None = None) -> Usage | None:
        """A chunk's usage: None unless continuous; else its choice's (``output``'s: its own
        prompt's tokens and cached tokens), or before any output the prompt's alone."""
        if not self.continuous:
            return None
        if output is None:
            return Usage.of(self.prompt_tokens, 0, None)
        cached = output.metrics.num_cached_tokens
        return Usage.of(len(output.prompt_token_ids), len(output.token_ids), cached)


async def unless_gone(work: Awaitable[T], request: Request) -> T:
    """``work``'s result; a client that hangs up first cancels it (which aborts the request
    and frees its blocks) and gets 499."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                raise HTTPException(CLIENT_GONE, "the client closed the connection")
        return task.result()
    finally:
        task.cancel()  # cancelling the stream's reader aborts the request


async def whole_answer(streams: Sequence[EngineStream], request: Request) -> Finals:
    """``finals`` of a request answered at once, unless the client hangs up first."""
    try:
        return await unless_gone(finals(streams), request)
    finally:
        for stream in streams:
            await stream.aclose()


def sse(body: BaseModel) -> str:
    return f"data: {body.model_dump_json()}\n\n"


class Generating(Protocol):
    """What both request bodies share (``CompletionRequest``'s fields, which chat takes)."""

    model: str | None
    stop: list[str] | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    ignore_eos: bool
    n: int
    stream: bool
    stream_options: StreamOptions | None


def check_request(body: Generating, runtime: Runtime, settings: Settings) -> None:
    """The checks both routes make first: the model's name and the stop list's size."""
    check_model(body.model, runtime.model_name)
    check_stop_list(list(body.stop or []), settings.max_stop_strings, settings.max_stop_length)


def sampling_params(
    body: Generating,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    constraint: GrammarConstraint | None = None,
) -> SamplingParams:
    """The engine's params: the body's sampling fields, and what the route decided (the
    compiled ``response_format``: control/api/structured.py)."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        seed=body.seed,
        stop=list(body.stop or []),
        ignore_eos=body.ignore_eos,
        n=body.n,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        constraint=constraint,
    )


@dataclass(frozen=True)
class Answers:
    """How a route answers: its whole answer's model and its chunks' model, both with ``id``,
    ``created``, ``model``, ``choices`` and ``usage`` (``what`` it answers names the answer in
    ``/openapi.json``)."""

    whole: type[BaseModel]
    chunk: type[BaseModel]
    what: str

    @property
    # Any: FastAPI's responses= mapping (OpenAPI fragments)
    def responses(self) -> dict[int | str, dict[str, Any]]:
        """OpenAPI ``responses`` of the route: the answer, or with ``stream: true`` its
        server-sent events; then the ``/v1`` refusals."""
        one = self.chunk.__name__ + (" chunk" if self.chunk is self.whole else "")
        event = {
            "type": "object",
            "description": "One server-sent event (the schema of each event, as OpenAPI 3.1 "
            "reads it).",
            "properties": {
                "data": {
                    "type": "string",
                    "description": f"A {one} as JSON; an ErrorResponse as JSON if the "
                    "request failed midway; `[DONE]` last.",
                }
            },
            "required": ["data"],
        }
        return {
            200: {
                "description": f"The {self.what}; with `stream: true`, server-sent events of "
                f"{one} objects ending in `data: [DONE]`.",
                "content": {"text/event-stream": {"schema": event}},
            },
            **public_errors(400, 401, 404, 413, 429, 500, 503),
        }

    async def answer(
        self,
        body: Generating,
        request_id: str,
        runtime: Runtime,
        prompts: Sequence[PromptStream[Choice]],
        request: Request,
        prompt_tokens: int,
        first: Iterable[list[Choice]] = (),
    ) -> BaseModel | StreamingResponse:
        """The whole answer once every choice of every prompt is done, or its event stream
        (see ``events``).

        Every refusal was raised before this: it answers with a JSON error, never with an
        event stream. The stream starts at once (clients see the queue time as time to first
        token); a failure from then on ends it with an error event."""
        created, model = int(time.time()), runtime.model_name
        await admitted(prompts)  # a replica's refusal (429) before any byte of the answer
        if not body.stream:
            last = await whole_answer([p.stream for p in prompts], request)
            choices = {prompts[i].offset + j: (prompts[i], out) for (i, j), out in last.items()}
            return self.whole(
                id=request_id,
                created=created,
                model=model,
                choices=[
                    part.render.final(output, index)
                    for index, (part, output) in sorted(choices.items(), key=lambda c: c[0])
                ],
                usage=usage(last),
            )
        chunk = Chunker[Choice](self.chunk, request_id, created, model)
        report = StreamUsage.of(body.stream_options, prompt_tokens)
        on_failure = runtime.metrics.count_failed
        return event_stream(events(prompts, chunk, report, on_failure, first))


class Chunker(Generic[Choice]):
    """One SSE ``data:`` line per chunk of a ``response`` model, all with the request's id,
    time and model."""

    def __init__(self, response: type[BaseModel], request_id: str, created: int, model: str):
        self.response = response
        self.request_id, self.created, self.model = request_id, created, model

    def __call__(self, choices: list[Choice], usage: Usage | None = None) -> str:
        return sse(
            self.response(
                id=self.request_id,
                created=self.created,
                model=self.model,
                choices=choices,
                usage=usage,
            )
        )


async def events(
    prompts: Sequence[PromptStream[Choice]],
    chunk: Chunker[Choice],
    report: StreamUsage,
    on_failure: Callable[[], None],
    first: Iterable[list[Choice]] = (),
) -> AsyncIterator[str]:
    """The stream's events: the ``first`` chunks (at once: clients time the first token from
    the first chunk), each choice's chunks as they come (a batch's prompts interleaved), the
    usage if asked (see ``StreamUsage``), ``[DONE]``. An engine failure ends it with an error
    event; a client that goes away aborts the requests."""
    last: Finals = {}
    try:
        for choices in first:
            yield chunk(choices, report.so_far())
        async with aclosing(merged([part.stream for part in prompts])) as outputs:
            async for prompt, output in outputs:  # closed with this stream, even at a yield
                last[prompt, output.index] = output
                part = prompts[prompt]
                choice = part.render.chunk(output, part.offset + output.index)
                if choice is not None:
                    yield chunk([choice], report.so_far(output))
        if report.final and last:
            yield chunk([], usage(last))
    except (EngineStepError, EngineStopped) as exc:
        on_failure()
        code = "engine_stopped" if isinstance(exc, EngineStopped) else "engine_error"
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code=code)))
    finally:
        for part in prompts:
            await part.stream.aclose()
    yield "data: [DONE]\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
