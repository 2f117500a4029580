"""``POST /v1/chat/completions``: the messages rendered with the checkpoint's chat template
(control/chat/template.py) in a render worker process (control/chat/render.py, bounded in time
and size), then tokenized on a worker thread and generated like a completion.

The rendered text is tokenized without the tokenizer's own special tokens (its BOS): the
template writes those itself, as ``apply_chat_template(tokenize=True)`` and vLLM do. The
waiting, the disconnect handling, the usage and the event stream are control/api/generation.py's,
shared with the completions route. ``tools`` are checked, shown to the template (or in the
fallback form) and, when a call is forced, turned into the answer's grammar by
control/api/tools.py; the answer's calls are parsed by control/api/chat_choices.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from control.api.chat_choices import Render
from control.api.deps import ApiKeyDep, AuthKeyDep, ContextDep, RuntimeDep
from control.api.errors import RETRY_AFTER_S, ApiError, rejection_code
from control.api.generation import Answers, check_request, sampling_params
from control.api.limits import CostFields, RequestCost, check_request_cost
from control.api.prompt_streams import PromptStream
from control.api.structured import constraint_of
from control.api.tools import (
    check_conflicts,
    for_template,
    style_for,
    tool_constraint,
    tool_request,
)
from control.chat.render import ChatRenderer, RendererBusy
from control.chat.schemas import ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse
from control.chat.template import ChatTemplateError
from control.core.api_keys import tenant_of
from control.requests_text import watched
from engine.admission import check_text_size
from engine.errors import RequestRejected
from engine.front import EngineFront, QueuedPrompt
from engine.sampling_params import GrammarConstraint, SamplingParams

router = APIRouter(tags=["public"], dependencies=[ApiKeyDep])
ANSWERS = Answers(ChatCompletionResponse, ChatCompletionChunk, "chat completion")


@router.post(
    "/v1/chat/completions", response_model=ChatCompletionResponse, responses=ANSWERS.responses
)
async def create_chat_completion(
    body: ChatCompletionRequest,
    runtime: RuntimeDep,
    ctx: ContextDep,
    request: Request,
    key: AuthKeyDep,
) -> BaseModel | StreamingResponse:
    check_request(body, runtime, ctx.settings)
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(
            400,
            "top_logprobs needs logprobs: true",
            param="top_logprobs",
            code="unsupported_combination",
            reason="invalid",
        )
    conversation = body.conversation()
    front = runtime.service.front
    tools = await tool_request(body, front)
    constraint = await constraint_of(body.response_format, body.structured_outputs, front)
    check_conflicts(tools, constraint)
    model_dir = Path(front.config.tokenizer or front.config.model)  # --tokenizer: its template
    style = await style_for(conversation, tools, model_dir, ctx.settings.tool_call_parser)
    messages, template_tools = for_template(conversation, tools, style)
    text = await _render(
        runtime.renderer, model_dir, messages, body.add_generation_prompt, template_tools
    )
    constraint = constraint or await tool_constraint(tools, style, front)
    token_ids = await run_in_threadpool(_prompt_token_ids, front, text)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    params = engine_params(body, front.limits.max_model_len - len(token_ids), constraint)
    settings = ctx.settings
    check_request_cost(
        RequestCost.of([len(token_ids)], params.n, params.max_tokens, params.logprobs),
        settings.max_request_tokens,
        settings.max_logprob_entries,
        front.limits.max_model_len,
        CostFields(tokens=body.output_limit_field, logprobs="top_logprobs"),
    )
    try:
        prompt = QueuedPrompt(
            token_ids, params, request_id, body.priority, tenant_of(key, body.user)
        )
        stream = runtime.service.add_requests([prompt])[0]
    except RequestRejected as exc:  # the engine names its own fields
        names = {"prompt": "messages", "max_tokens": body.output_limit_field}
        renamed = RequestRejected(str(exc), names.get(exc.param, exc.param))
        # the error handler reads `code` where a refusal carries one (getattr)
        renamed.code = rejection_code(exc)  # type: ignore[attr-defined]
        raise renamed from exc
    parse = style.format if tools is not None and style is not None else None
    render = Render(body, front, parse, tools is None or tools.parallel)
    part = PromptStream(watched(runtime.text, stream, lambda: text), render)
    return await ANSWERS.answer(
        body, request_id, runtime, [part], request, len(token_ids), render.roles()
    )


async def _render(
    renderer: ChatRenderer,
    model_dir: Path,
    conversation: list[dict[str, Any]],  # Any: the template's context, JSON (as tools)
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
) -> str:
    """The conversation's prompt text; every way the template can fail is a 400."""
    try:
        return await renderer.render(model_dir, conversation, add_generation_prompt, tools)
    except RendererBusy as exc:
        raise ApiError(
            429,
            f"{exc}: try again",
            param="messages",
            code="chat_template_busy",
            reason="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from exc
    except ChatTemplateError as exc:
        if exc.cause == "missing":
            raise ApiError(
                400,
                f"this model has no chat_template (none in {model_dir.name}'s "
                "tokenizer_config.json, chat_template.jinja or chat_template.json): "
                "use /v1/completions",
                param="messages",
                code="chat_template_missing",
                reason="invalid",
            ) from exc
        if exc.cause == "does_not_compile":
            message = f"this model's chat_template cannot be used: {exc}"
        elif exc.cause == "refused":
            message = f"the chat_template refused the messages: {exc}"
        else:
            message = str(exc)
        raise _template_error(message) from exc


def _prompt_token_ids(front: EngineFront, text: str) -> list[int]:
    """The rendered text tokenized (on a worker thread: it takes CPU time)."""
    if front.tokenizer is None:
        raise RequestRejected("this model has no tokenizer: chat needs one", "messages")
    try:
        check_text_size(text, front.max_prompt_bytes, front.limits.max_model_len)
    except RequestRejected as exc:
        raise RequestRejected(f"the rendered messages: {exc}", "messages") from exc
    return front.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids


def _template_error(message: str) -> ApiError:
    return ApiError(400, message, param="messages", code="chat_template_error", reason="invalid")


def engine_params(
    body: ChatCompletionRequest, room: int, constraint: GrammarConstraint | None = None
) -> SamplingParams:
    """Without an output limit, the answer may take the ``room`` the context has left after
    the prompt. ``constraint``: the compiled ``response_format`` (control/api/structured.py)."""
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return sampling_params(body, body.output_limit or max(room, 1), logprobs, None, constraint)
