"""``POST /v1/completions``: OpenAI-compatible, streamed as server-sent events on request.

``n`` choices are one engine request of ``n`` sequences (the prompt computed once, then
forked); their outputs interleave on one stream, each chunk naming its choice's ``index``.
``logprobs`` are rendered by control/api/logprobs.py; ``echo`` prepends the prompt's text
(the first chunk of each choice carries it when streaming) and, with ``logprobs``, its tokens'
logprobs (``SamplingParams.prompt_logprobs``; the first token has none).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from tokenizers import Tokenizer

from control.api.deps import ApiKeyDep, ContextDep, RuntimeDep
from control.api.errors import ApiError, public_errors
from control.api.limits import check_stop_list, prompt_token_ids
from control.api.logprobs import TokenTexts, completion_logprobs
from control.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    Usage,
)
from engine.async_engine import EngineStepError, EngineStopped, RequestStream
from engine.outputs import RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams

router = APIRouter(tags=["public"], dependencies=[ApiKeyDep])
DISCONNECT_POLL_S = 0.25
CLIENT_GONE = 499
T = TypeVar("T")

SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event (the schema of each event, as OpenAPI 3.1 reads it).",
    "properties": {
        "data": {
            "type": "string",
            "description": "A CompletionResponse chunk as JSON; an ErrorResponse as JSON if the "
            "request failed midway; `[DONE]` last.",
        }
    },
    "required": ["data"],
}
RESPONSES = {
    200: {
        "description": "The completion; with `stream: true`, server-sent events of "
        "CompletionResponse chunks ending in `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    },
    **public_errors(400, 401, 404, 413, 429, 500, 503),
}


@router.post("/v1/completions", response_model=CompletionResponse, responses=RESPONSES)
async def create_completion(
    body: CompletionRequest, runtime: RuntimeDep, ctx: ContextDep, request: Request
):
    if body.model is not None and body.model != runtime.model_name:
        raise ApiError(
            404,
            f"model {body.model!r} does not exist; this server serves {runtime.model_name!r}",
            param="model",
            code="model_not_found",
            reason="unknown_model",
        )
    settings = ctx.settings
    check_stop_list(list(body.stop or []), settings.max_stop_strings, settings.max_stop_length)
    engine = runtime.llm_engine
    token_ids = await prompt_token_ids(body.prompt, engine)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    stream = runtime.engine.add_request(token_ids, sampling_params(body), request_id)
    created = int(time.time())
    render = Render(body, engine.tokenizer, token_ids)
    if not body.stream:
        try:
            finals = await _unless_gone(_finals(stream), request)
        finally:
            await stream.aclose()
        return CompletionResponse(
            id=request_id,
            created=created,
            model=runtime.model_name,
            choices=[render.final(finals[i]) for i in sorted(finals)],
            usage=_usage(finals.values()),
        )
    # Every refusal was raised above, before this: it answers with a JSON error, never with
    # an event stream. The stream starts at once (clients see the queue time as time to
    # first token); a failure from here on ends it with an error event.
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    events = _events(
        stream,
        Chunker(request_id, created, runtime.model_name),
        render,
        include_usage,
        runtime.metrics.count_failed,
    )
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _unless_gone(work: Awaitable[T], request: Request) -> T:
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


async def _finals(stream: RequestStream) -> dict[int, RequestOutput]:
    """The last output of each of the request's sequences, by choice index."""
    finals: dict[int, RequestOutput] = {}
    async for output in stream:
        finals[output.index] = output
    return finals


def sampling_params(body: CompletionRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        seed=body.seed,
        stop=list(body.stop or []),
        ignore_eos=body.ignore_eos,
        n=body.n,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if body.echo else None,
    )


class Render:
    """Choices of one request: the echoed prompt and the logprobs, whole or chunk by chunk
    (per choice, the tokens since its last chunk and where their text starts)."""

    def __init__(
        self, body: CompletionRequest, tokenizer: Tokenizer | None, prompt_ids: list[int]
    ) -> None:
        self.want_logprobs = body.logprobs is not None
        self.echo_logprobs = body.echo and self.want_logprobs
        self.first_token = prompt_ids[0]
        self.texts = TokenTexts(tokenizer)
        self.echo = ""
        if body.echo:
            prompt = body.prompt
            if isinstance(prompt, str):
                self.echo = prompt
            elif tokenizer is not None:
                self.echo = tokenizer.decode(prompt, skip_special_tokens=False)
        self._pending: dict[int, list[TokenLogprob]] = {}
        self._offset: dict[int, int] = {}
        self._started: set[int] = set()

    def final(self, output: RequestOutput) -> CompletionChoice:
        logprobs = None
        if self.echo_logprobs:
            entries = (output.prompt_logprobs or []) + (output.logprobs or [])
            logprobs, _ = completion_logprobs(entries, self.texts, 0, self.first_token)
        elif self.want_logprobs:
            logprobs, _ = completion_logprobs(output.logprobs or [], self.texts)
        return _choice(output, self.echo + output.text, logprobs)

    def chunk(self, output: RequestOutput) -> CompletionChoice | None:
        """The choice's next chunk: one for each step that gave it a token, even when the
        token's text is held back (an incomplete character, a possible stop string) — a
        client's clock then sees every token, as vLLM streams; None for a step without one."""
        index = output.index
        pending = self._pending.setdefault(index, [])
        if self.want_logprobs:
            pending.extend(output.new_logprobs or [])
        if not (output.new_token_ids or output.text_delta or output.finished):
            return None
        text, first = output.text_delta, None
        if index not in self._started:
            self._started.add(index)
            text = self.echo + text
            if self.echo_logprobs:
                pending[:0] = output.prompt_logprobs or []
                first = self.first_token
        logprobs = None
        if self.want_logprobs:
            logprobs, self._offset[index] = completion_logprobs(
                pending, self.texts, self._offset.get(index, 0), first
            )
            pending.clear()
        return _choice(output, text, logprobs)


class Chunker:
    """One SSE ``data:`` line per chunk, all with the request's id, time and model."""

    def __init__(self, request_id: str, created: int, model: str) -> None:
        self.request_id, self.created, self.model = request_id, created, model

    def __call__(self, choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        body = CompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
        )
        return _sse(body)


async def _events(
    stream: RequestStream,
    chunk: Chunker,
    render: Render,
    include_usage: bool,
    on_failure: Callable[[], None],
) -> AsyncIterator[str]:
    last: dict[int, RequestOutput] = {}
    try:
        async for output in stream:
            last[output.index] = output
            choice = render.chunk(output)
            if choice is not None:
                yield chunk([choice])
        if include_usage and last:
            yield chunk([], _usage(last.values()))
    except (EngineStepError, EngineStopped) as exc:
        on_failure()
        code = "engine_stopped" if isinstance(exc, EngineStopped) else "engine_error"
        yield _sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code=code)))
    finally:
        await stream.aclose()  # a client that went away aborts the request
    yield "data: [DONE]\n\n"


def _sse(body: BaseModel) -> str:
    return f"data: {body.model_dump_json()}\n\n"


def _choice(
    output: RequestOutput, text: str, logprobs: CompletionLogprobs | None = None
) -> CompletionChoice:
    return CompletionChoice(
        index=output.index,
        text=text,
        logprobs=logprobs,
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason if output.finished else None,
    )


def _usage(finals: Iterable[RequestOutput]) -> Usage:
    """The prompt once, every choice's tokens."""
    outputs = list(finals)
    prompt = len(outputs[0].prompt_token_ids)
    completion = sum(len(output.token_ids) for output in outputs)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
