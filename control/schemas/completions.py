"""``/v1/completions``' bodies (OpenAI's shape; strict types), the usage and the stream
options that chat shares."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic_core import PydanticCustomError

from control.api.openai_fields import JsonInt, UnsupportedFields, _json_integer
from engine.front import Prompt
from engine.sampling_params import MAX_LOGPROBS, MAX_N

SEED_BOUNDS = (-(2**53), 2**53)
"""Integers a JSON number holds exactly (so the bounds in ``/openapi.json``, written as
floats, are exact too); ``torch.Generator.manual_seed`` takes all of them."""


def _valid_unicode(value: str, field: str) -> str:
    """JSON can carry a lone surrogate (``"a\\ud800b"``) that no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field} is not valid Unicode: a lone surrogate at index {exc.start}"
        ) from None
    return value


class StreamOptions(BaseModel):
    include_usage: StrictBool = Field(
        False, description="A last chunk, with no choices, carries the request's usage."
    )
    continuous_usage_stats: StrictBool = Field(
        False,
        description="vLLM's extension, with include_usage: every chunk also carries its "
        "choice's usage so far (load testers such as guidellm ask for it).",
    )


TextPrompt = Annotated[StrictStr, Field(min_length=1)]


TokenId = Annotated[StrictInt, Field(ge=0), BeforeValidator(_json_integer)]
"""A ``JsonInt`` >= 0 (the bound before the validator, so the JSON schema says ``minimum``)."""


TokenPrompt = Annotated[list[TokenId], Field(min_length=1)]


TextBatch = Annotated[list[TextPrompt], Field(min_length=1)]
TokenBatch = Annotated[list[TokenPrompt], Field(min_length=1)]
"""A batch: several prompts in one request, as OpenAI and vLLM take them (lm-evaluation-harness
sends its log-likelihood requests so). Its size is bounded by the server's
``max_batch_prompts``, checked by the route (``control.api.limits.check_batch_size``)."""


Seed = Annotated[
    StrictInt, Field(ge=SEED_BOUNDS[0], le=SEED_BOUNDS[1]), BeforeValidator(_json_integer)
]


StopString = Annotated[StrictStr, Field(min_length=1)]


LogprobsCount = Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(_json_integer)]
"""How many most likely tokens to list per token (the bound before the validator, so the JSON
schema says ``minimum``/``maximum`` inside the nullable field)."""


PromptField = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(UnsupportedFields):
    """Types are strict where OpenAI's schema is (no ``"yes"`` for a boolean, no ``true`` for
    a token id); numbers may be written as integers. Limits that depend on the server's
    settings (stop list size, prompt length) are checked by the route and answer 400; the
    stop list's are written into ``/openapi.json`` from the settings
    (``control.api.openapi.document_stop_limits``). Fields accepted only at their default
    (``best_of``, penalties, ``logit_bias``, ...) come from ``UnsupportedFields``."""

    model: StrictStr | None = None
    prompt: TextPrompt | TokenPrompt | TextBatch | TokenBatch = Field(
        description="Text, token ids, or a batch: a list of texts or of token-id lists (at most "
        "max_batch_prompts, a server setting). Nothing empty. Each prompt gets its own n "
        "choices, numbered prompt × n + choice."
    )
    max_tokens: JsonInt = Field(
        16, ge=1, description="Prompt tokens + max_tokens must fit max_model_len."
    )
    temperature: StrictFloat = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: JsonInt = Field(0, ge=-1, description="0 or -1: no top-k cut.")
    seed: Seed | None = Field(
        None, description="The request's own random generator; |seed| <= 2**53."
    )
    stop: StopString | list[StopString] | None = Field(
        None,
        description="Non-empty strings: at most max_stop_strings of them, each at most "
        "max_stop_length characters (server settings).",
    )
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = Field(False, description="Extension: keep generating past EOS.")
    n: JsonInt = Field(
        1,
        ge=1,
        le=MAX_N,
        description="Choices to generate; they share the prompt's KV blocks (computed once). "
        "With a seed, choice i samples with seed + i.",
    )
    logprobs: LogprobsCount | None = Field(
        None,
        description="Log-probabilities of each token and of the N most likely ones (plus the "
        "chosen one), from the model's raw distribution (before temperature, top-k, top-p).",
    )
    echo: StrictBool = Field(
        False,
        description="Prepend the prompt to each choice's text (with logprobs: and its tokens' "
        "logprobs, the first token's null).",
    )
    suffix: StrictStr | None = Field(
        None,
        description='Only "" (or null) is accepted: insertion is not supported.',
        json_schema_extra={"maxLength": 0},
    )
    tools: list[Any] | None = Field(  # Any: refused unless empty, so never read
        None,
        description="Only [] (or null) is accepted: tool calls are served on /v1/chat/completions.",
        json_schema_extra={"maxItems": 0},
    )

    @field_validator("model")
    @classmethod
    def _model_unicode(cls, value: str | None) -> str | None:
        return None if value is None else _valid_unicode(value, "model")

    @field_validator("prompt", mode="before")
    @classmethod
    def _batch_shape(cls, value: object) -> object:
        """One clear refusal for a batch's usual mistakes (the union would list each of its
        members' errors): an empty list, a mix of texts, token ids and lists, an empty
        prompt in the batch."""
        if not isinstance(value, list):
            return value
        if not value:
            raise PydanticCustomError("empty_prompt", "prompt is empty")
        texts = sum(isinstance(item, str) for item in value)
        lists = sum(isinstance(item, list) for item in value)
        if texts not in (0, len(value)) or lists not in (0, len(value)):
            raise PydanticCustomError(
                "mixed_batch",
                "a batch's prompts are all texts or all token-id lists (one prompt's token "
                "ids are a flat list of integers)",
            )
        for index, item in enumerate(value):
            if item in ("", []):
                raise PydanticCustomError(
                    "empty_prompt", "prompt {index} of the batch is empty", {"index": index}
                )
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_unicode(cls, value: PromptField) -> PromptField:
        for text in [value] if isinstance(value, str) else value:
            if isinstance(text, str):
                _valid_unicode(text, "prompt")
        return value

    def prompts(self) -> list[Prompt]:
        """The request's prompts in order: its one prompt, or its batch's."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        # validated: all token ids, all texts or all token lists
        items: list[int | str | list[int]] = [*self.prompt]
        token_ids = [item for item in items if isinstance(item, int)]
        return [token_ids] if token_ids else [item for item in items if not isinstance(item, int)]

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise PydanticCustomError(
                "unsupported_value",
                "tools is not supported: only an empty value is accepted (tool calls are "
                "served on /v1/chat/completions)",
            )
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise PydanticCustomError(
                "unsupported_value", 'suffix is not supported: only "" is accepted'
            )
        return value

    @field_validator("stop")
    @classmethod
    def _stops_as_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        for stop in stops:
            _valid_unicode(stop, "stop")
        return stops


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(
        description="Prompt tokens served from the prefix cache (whole KV blocks another "
        "request computed), counted once per prompt, as OpenAI and vLLM report them."
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = Field(
        None,
        description="Always in a whole answer and in a stream's usage chunk; in vLLM's "
        "continuous usage, once the prompt was computed.",
    )

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None) -> Usage:
        """``cached``: the prompt tokens the prefix cache served (None: not known yet)."""
        details = None if cached is None else PromptTokensDetails(cached_tokens=cached)
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=details,
        )


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions logprobs, one entry per token of the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] = Field(
        description="Per token: the N most likely tokens' log-probabilities, most likely "
        "first, plus the chosen token's."
    )
    text_offset: list[int] = Field(description="Where each token's text starts.")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    stop_reason: str | int | None = Field(
        None, description="Extension: the stop string or token id that ended the text."
    )


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
