"""``POST /v1/completions``: OpenAI-compatible, streamed as server-sent events on request.

``prompt`` is one prompt (text or token ids) or a batch of them (texts or token-id lists), as
OpenAI and vLLM take it: each prompt is an engine request of its own (id ``<id>-<i>``), the
batch admitted whole or refused whole (``EngineService.add_requests``), and every limit counts
the whole batch. Prompt ``i``'s ``n`` choices are indexes ``i × n .. i × n + n - 1``.
``n`` choices are one engine request of ``n`` sequences (the prompt computed once, then
forked); their outputs interleave on one stream, each chunk naming its choice's ``index``.
``logprobs`` are rendered by control/api/logprobs.py; ``echo`` prepends each prompt's text
(the first chunk of each choice carries it when streaming) and, with ``logprobs``, its tokens'
logprobs (``SamplingParams.prompt_logprobs``; the first token has none).
"""

from __future__ import annotations

import uuid
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from tokenizers import Tokenizer

from control.api.deps import ApiKeyDep, AuthKeyDep, ContextDep, RuntimeDep
from control.api.generation import Answers, Generating, check_request, sampling_params
from control.api.limits import (
    RequestCost,
    check_batch_size,
    check_request_cost,
    prompt_token_ids,
)
from control.api.logprobs import TokenTexts, completion_logprobs
from control.api.prompt_streams import PromptStream
from control.api.structured import constraint_of
from control.core.api_keys import tenant_of
from control.requests_text import watched
from control.schemas.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from engine.front import Prompt, QueuedPrompt
from engine.outputs import RequestOutput, TokenLogprob
from engine.sampling_params import GrammarConstraint, SamplingParams

router = APIRouter(tags=["public"], dependencies=[ApiKeyDep])
ANSWERS = Answers(CompletionResponse, CompletionResponse, "completion")


def generating(body: CompletionRequest) -> Generating:
    """The body as the generation code reads it: its ``stop`` is a list once validated
    (``_stops_as_list``), while the field declares the wire's string or list."""
    return body  # type: ignore[return-value]  # stop: a list after its validator (see above)


@router.post("/v1/completions", response_model=CompletionResponse, responses=ANSWERS.responses)
async def create_completion(
    body: CompletionRequest,
    runtime: RuntimeDep,
    ctx: ContextDep,
    request: Request,
    key: AuthKeyDep,
) -> BaseModel | StreamingResponse:
    settings = ctx.settings
    check_request(generating(body), runtime, settings)
    prompts = body.prompts()
    check_batch_size(len(prompts), settings.max_batch_prompts)
    front = runtime.service.front
    token_ids = await prompt_token_ids(prompts, front)
    lengths = [len(ids) for ids in token_ids]
    cost = RequestCost.of(lengths, body.n, body.max_tokens, body.logprobs, body.echo)
    check_request_cost(
        cost,
        settings.max_request_tokens,
        settings.max_logprob_entries,
        front.limits.max_model_len,
    )
    constraint = await constraint_of(body.response_format, body.structured_outputs, front)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    params = engine_params(body, constraint)
    ids = prompt_request_ids(request_id, len(prompts))
    tenant = tenant_of(key, body.user)
    batch = [
        QueuedPrompt(tokens, params, rid, body.priority, tenant)
        for tokens, rid in zip(token_ids, ids, strict=True)
    ]
    streams = runtime.service.add_requests(batch)
    parts = [
        PromptStream(
            watched(runtime.text, stream, partial(prompt_text, prompt, front.tokenizer)),
            Render(body, front.tokenizer, prompt, tokens),
            i * body.n,
        )
        for i, (stream, prompt, tokens) in enumerate(zip(streams, prompts, token_ids, strict=True))
    ]
    return await ANSWERS.answer(generating(body), request_id, runtime, parts, request, sum(lengths))


def prompt_request_ids(request_id: str, prompts: int) -> list[str]:
    """The engine's request id of each prompt: the answer's own for one, ``<id>-<i>`` for a
    batch's (each prompt is a request of its own)."""
    return [request_id] if prompts == 1 else [f"{request_id}-{i}" for i in range(prompts)]


def prompt_text(prompt: Prompt, tokenizer: Tokenizer | None) -> str:
    """A prompt as text: its own, or its token ids decoded (as ``echo`` shows them)."""
    if isinstance(prompt, str):
        return prompt
    if tokenizer is None:
        return " ".join(map(str, prompt))
    return tokenizer.decode(prompt, skip_special_tokens=False)


def engine_params(
    body: CompletionRequest, constraint: GrammarConstraint | None = None
) -> SamplingParams:
    return sampling_params(
        generating(body),
        body.max_tokens,
        body.logprobs,
        body.logprobs if body.echo else None,
        constraint,
    )


class Render:
    """Choices of one prompt: the echoed prompt and the logprobs, whole or chunk by chunk
    (per choice, the tokens since its last chunk and where their text starts)."""

    def __init__(
        self,
        body: CompletionRequest,
        tokenizer: Tokenizer | None,
        prompt: Prompt,
        prompt_ids: list[int],
    ) -> None:
        self.want_logprobs = body.logprobs is not None
        self.echo_logprobs = body.echo and self.want_logprobs
        self.first_token = prompt_ids[0]
        self.texts = TokenTexts(tokenizer)
        self.echo = ""
        if body.echo:
            if isinstance(prompt, str):
                self.echo = prompt
            elif tokenizer is not None:
                self.echo = tokenizer.decode(prompt, skip_special_tokens=False)
        self._pending: dict[int, list[TokenLogprob]] = {}
        self._offset: dict[int, int] = {}
        self._started: set[int] = set()

    def final(self, output: RequestOutput, index: int) -> CompletionChoice:
        logprobs = None
        if self.echo_logprobs:
            entries = (output.prompt_logprobs or []) + (output.logprobs or [])
            logprobs, _ = completion_logprobs(entries, self.texts, 0, self.first_token)
        elif self.want_logprobs:
            logprobs, _ = completion_logprobs(output.logprobs or [], self.texts)
        return _choice(output, index, self.echo + output.text, logprobs)

    def chunk(self, output: RequestOutput, index: int) -> CompletionChoice | None:
        """The choice's next chunk: one for each step that gave it a token, even when the
        token's text is held back (an incomplete character, a possible stop string) — a
        client's clock then sees every token, as vLLM streams; None for a step without one."""
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
        return _choice(output, index, text, logprobs)


def _choice(
    output: RequestOutput, index: int, text: str, logprobs: CompletionLogprobs | None = None
) -> CompletionChoice:
    return CompletionChoice(
        index=index,
        text=text,
        logprobs=logprobs,
        finish_reason=output.finish_reason,
        stop_reason=output.stop_reason if output.finished else None,
    )
