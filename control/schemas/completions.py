"""``/v1/completions``' bodies (OpenAI's shape; strict types), the usage and the stream
options that chat shares."""

from __future__ import annotations

from typing import Annotated, Literal

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


Seed = Annotated[
    StrictInt, Field(ge=SEED_BOUNDS[0], le=SEED_BOUNDS[1]), BeforeValidator(_json_integer)
]


StopString = Annotated[StrictStr, Field(min_length=1)]


LogprobsCount = Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(_json_integer)]
"""How many most likely tokens to list per token (the bound before the validator, so the JSON
schema says ``minimum``/``maximum`` inside the nullable field)."""


class CompletionRequest(UnsupportedFields):
    """Types are strict where OpenAI's schema is (no ``"yes"`` for a boolean, no ``true`` for
    a token id); numbers may be written as integers. Limits that depend on the server's
    settings (stop list size, prompt length) are checked by the route and answer 400; the
    stop list's are written into ``/openapi.json`` from the settings
    (``control.api.limits.document_stop_limits``). Fields accepted only at their default
    (``best_of``, penalties, ``logit_bias``, ...) come from ``UnsupportedFields``."""

    model: StrictStr | None = None
    prompt: TextPrompt | TokenPrompt = Field(description="Text, or token ids (not empty).")
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

    @field_validator("model")
    @classmethod
    def _model_unicode(cls, value: str | None) -> str | None:
        return None if value is None else _valid_unicode(value, "model")

    @field_validator("prompt")
    @classmethod
    def _prompt_unicode(cls, value: str | list[int]) -> str | list[int]:
        return _valid_unicode(value, "prompt") if isinstance(value, str) else value

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


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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
