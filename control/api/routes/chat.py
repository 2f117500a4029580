"""``POST /v1/chat/completions``: the messages rendered with the checkpoint's chat template
(control/chat_template.py), then generated like a completion.

The rendered text is tokenized without the tokenizer's own special tokens (its BOS): the
template writes those itself, as ``apply_chat_template(tokenize=True)`` and vLLM do. The
waiting, the disconnect handling and the usage are the completions route's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from control.api.chat_choices import Chunker, Render
from control.api.deps import ApiKeyDep, ContextDep, RuntimeDep
from control.api.errors import ApiError, public_errors, rejection_code
from control.api.limits import check_stop_list
from control.api.routes.completions import _finals, _sse, _unless_gone, _usage
from control.chat_schemas import (
    ChatChunkChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
)
from control.chat_template import ChatTemplateError, load_chat_template
from control.schemas import ErrorInfo, ErrorResponse
from engine.admission import check_text_size
from engine.async_engine import EngineStepError, EngineStopped, RequestStream
from engine.engine import LLMEngine
from engine.errors import RequestRejected
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

router = APIRouter(tags=["public"], dependencies=[ApiKeyDep])

SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event (the schema of each event, as OpenAPI 3.1 reads it).",
    "properties": {
        "data": {
            "type": "string",
            "description": "A ChatCompletionChunk as JSON; an ErrorResponse as JSON if the "
            "request failed midway; `[DONE]` last.",
        }
    },
    "required": ["data"],
}
RESPONSES = {
    200: {
        "description": "The chat completion; with `stream: true`, server-sent events of "
        "ChatCompletionChunk objects ending in `data: [DONE]`.",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    },
    **public_errors(400, 401, 404, 413, 429, 500, 503),
}


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=RESPONSES)
async def create_chat_completion(
    body: ChatCompletionRequest, runtime: RuntimeDep, ctx: ContextDep, request: Request
):
    if body.model is not None and body.model != runtime.model_name:
        raise ApiError(
            404,
            f"model {body.model!r} does not exist; this server serves {runtime.model_name!r}",
            param="model",
            code="model_not_found",
            reason="unknown_model",
        )
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(
            400,
            "top_logprobs needs logprobs: true",
            param="top_logprobs",
            code="unsupported_combination",
            reason="invalid",
        )
    conversation = body.conversation()
    settings = ctx.settings
    check_stop_list(list(body.stop or []), settings.max_stop_strings, settings.max_stop_length)
    engine = runtime.llm_engine
    token_ids = await run_in_threadpool(
        _prompt_token_ids, engine, conversation, body.add_generation_prompt
    )
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    params = sampling_params(body, engine.limits.max_model_len - len(token_ids))
    try:
        stream = runtime.engine.add_request(token_ids, params, request_id)
    except RequestRejected as exc:  # the engine names its own fields
        names = {"prompt": "messages", "max_tokens": body.output_limit_field}
        renamed = RequestRejected(str(exc), names.get(exc.param, exc.param))
        renamed.code = rejection_code(exc)  # type: ignore[attr-defined]
        raise renamed from exc
    created = int(time.time())
    render = Render(body, engine)
    if not body.stream:
        try:
            finals = await _unless_gone(_finals(stream), request)
        finally:
            await stream.aclose()
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=runtime.model_name,
            choices=[render.final(finals[i]) for i in sorted(finals)],
            usage=_usage(finals.values()),
        )
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    chunk = Chunker(request_id, created, runtime.model_name)
    events = _events(stream, chunk, render, body.n, include_usage, runtime.metrics.count_failed)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _prompt_token_ids(
    engine: LLMEngine, conversation: list[dict], add_generation_prompt: bool
) -> list[int]:
    """The conversation rendered and tokenized (on a worker thread: both take CPU time)."""
    model_dir = Path(engine.config.model)
    try:
        template = load_chat_template(model_dir)
    except ChatTemplateError as exc:  # the checkpoint's template does not compile
        raise _template_error(f"this model's chat_template cannot be used: {exc}") from exc
    if template is None:
        raise ApiError(
            400,
            f"this model has no chat_template (none in {model_dir.name}'s "
            "tokenizer_config.json, chat_template.jinja or chat_template.json): "
            "use /v1/completions",
            param="messages",
            code="chat_template_missing",
            reason="invalid",
        )
    try:
        text = template.render(conversation, add_generation_prompt)
    except ChatTemplateError as exc:
        raise _template_error(f"the chat_template refused the messages: {exc}") from exc
    if engine.tokenizer is None:
        raise RequestRejected("this model has no tokenizer: chat needs one", "messages")
    try:
        check_text_size(text, engine.max_prompt_bytes, engine.limits.max_model_len)
    except RequestRejected as exc:
        raise RequestRejected(f"the rendered messages: {exc}", "messages") from exc
    return engine.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids


def _template_error(message: str) -> ApiError:
    return ApiError(400, message, param="messages", code="chat_template_error", reason="invalid")


def sampling_params(body: ChatCompletionRequest, room: int) -> SamplingParams:
    """The engine's params; without an output limit, the answer may take the ``room`` the
    context has left after the prompt."""
    return SamplingParams(
        max_tokens=body.output_limit or max(room, 1),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        seed=body.seed,
        stop=list(body.stop or []),
        ignore_eos=body.ignore_eos,
        n=body.n,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )


async def _events(
    stream: RequestStream,
    chunk: Chunker,
    render: Render,
    n: int,
    include_usage: bool,
    on_failure: Callable[[], None],
) -> AsyncIterator[str]:
    """Each choice's role first (at once: clients time the first token from the first
    chunk), then the text as it comes, then the usage if asked, then ``[DONE]``."""
    last: dict[int, RequestOutput] = {}
    try:
        for index in range(n):
            yield chunk(
                [ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))]
            )
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
