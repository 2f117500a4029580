"""``POST /v1/completions``: OpenAI-compatible, streamed as server-sent events on request."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from control.api.deps import RuntimeDep
from control.schemas import CompletionChoice, CompletionRequest, CompletionResponse, Usage
from engine.async_engine import EngineStepError, EngineStopped, RequestStream
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

router = APIRouter(tags=["public"])
DISCONNECT_POLL_S = 0.25

ERRORS = {
    400: {"description": "The request can never be served (names the field or limit)."},
    404: {"description": "Unknown model."},
    429: {"description": "The waiting queue is full; see Retry-After."},
    503: {"description": "The model is still loading."},
}


@router.post("/v1/completions", response_model=CompletionResponse, responses=ERRORS)
async def create_completion(body: CompletionRequest, runtime: RuntimeDep, request: Request):
    if body.model is not None and body.model != runtime.model_name:
        raise HTTPException(
            404, f"model {body.model!r} does not exist; this server serves {runtime.model_name!r}"
        )
    request_id = f"cmpl-{uuid.uuid4().hex}"
    stream = runtime.engine.add_request(body.prompt, sampling_params(body), request_id)
    created = int(time.time())
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        events = _events(stream, request_id, created, runtime.model_name, include_usage)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    final = await _until_finished_or_gone(stream, request)
    return CompletionResponse(
        id=request_id,
        created=created,
        model=runtime.model_name,
        choices=[_choice(final, final.text)],
        usage=_usage(final),
    )


async def _until_finished_or_gone(stream: RequestStream, request: Request) -> RequestOutput:
    """The final output; a client that hangs up first aborts the request (frees its blocks)."""
    collect = asyncio.ensure_future(_last(stream))
    try:
        while not collect.done():
            await asyncio.wait({collect}, timeout=DISCONNECT_POLL_S)
            if not collect.done() and await request.is_disconnected():
                collect.cancel()  # cancelling the stream's reader aborts the request
                raise HTTPException(499, "the client closed the connection")
        return collect.result()
    finally:
        collect.cancel()
        await stream.aclose()


async def _last(stream: RequestStream) -> RequestOutput:
    final: RequestOutput | None = None
    async for output in stream:
        final = output
    assert final is not None
    return final


def sampling_params(body: CompletionRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        seed=body.seed,
        stop=list(body.stop or []),
        ignore_eos=body.ignore_eos,
    )


async def _events(
    stream: RequestStream, request_id: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[str]:
    def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        body = CompletionResponse(
            id=request_id, created=created, model=model, choices=choices, usage=usage
        )
        return _sse(body)

    last: RequestOutput | None = None
    try:
        async for output in stream:
            last = output
            if output.text_delta or output.finished:
                yield chunk([_choice(output, output.text_delta)])
        if include_usage and last is not None:
            yield chunk([], _usage(last))
    except (EngineStepError, EngineStopped) as exc:
        error = {"error": {"message": str(exc), "type": "server_error"}}
        yield f"data: {json.dumps(error)}\n\n"
    finally:
        await stream.aclose()  # a client that went away aborts the request
    yield "data: [DONE]\n\n"


def _sse(body: BaseModel) -> str:
    return f"data: {body.model_dump_json()}\n\n"


def _choice(output: RequestOutput, text: str) -> CompletionChoice:
    return CompletionChoice(
        text=text,
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason if output.finished else None,
    )


def _usage(output: RequestOutput) -> Usage:
    prompt, completion = len(output.prompt_token_ids), len(output.token_ids)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
