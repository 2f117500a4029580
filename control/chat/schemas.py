"""``POST /v1/chat/completions``: the request and the answers (``chat.completion`` and, when
streamed, ``chat.completion.chunk``), as OpenAI writes them.

The sampling fields are ``CompletionRequest``'s own (same types, bounds and descriptions,
taken from its model fields), and so are the fields accepted only at their default
(``UnsupportedFields``). Messages are typed loosely enough that the route can name the exact
field at fault (``messages[1].content[0].type``) in its 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
)

from control.api.openai_fields import UnsupportedFields, _json_integer
from control.schemas.completions import CompletionRequest, LogprobsCount, Usage, _valid_unicode
from engine.errors import RequestRejected

OutputLimit = Annotated[StrictInt, Field(ge=1), BeforeValidator(_json_integer)]
"""A token count >= 1 (the bound before the validator, so the JSON schema says ``minimum``
inside the nullable field)."""
ROLES = ("system", "user", "assistant")
"""The roles a message may have (tool calls are not supported, so no ``tool``)."""


def _shared(name: str) -> Any:
    """``CompletionRequest``'s field ``name`` (type, bounds, default, description)."""
    info = CompletionRequest.model_fields[name]
    return Annotated[info.annotation, info]


class ContentPart(BaseModel):
    """A part of a message's content. Only text parts are served; the schema says so (``type``
    ``text``, ``text`` required), while the model takes any part so that the route can name
    the one it refuses (``messages[i].content[j].type``)."""

    model_config = ConfigDict(json_schema_extra={"required": ["type", "text"]})

    type: StrictStr = Field(json_schema_extra={"enum": ["text"]})
    text: Annotated[StrictStr | None, WithJsonSchema({"type": "string"})] = None

    @field_validator("text")
    @classmethod
    def _text_unicode(cls, value: str | None) -> str | None:
        return None if value is None else _valid_unicode(value, "text")


class ChatMessage(BaseModel):
    role: StrictStr = Field(json_schema_extra={"enum": list(ROLES)})
    content: StrictStr | list[ContentPart] | None = Field(
        None,
        description="Text, or a list of text parts (joined with newlines); null is empty.",
    )
    name: StrictStr | None = None

    @field_validator("content")
    @classmethod
    def _content_unicode(cls, value: Any) -> Any:
        return _valid_unicode(value, "content") if isinstance(value, str) else value

    def plain(self, i: int) -> dict[str, Any]:
        """The message as the template sees it (``role``, ``content`` as text, ``name`` if
        given); raises ``RequestRejected`` naming the field (``messages[i].content[j].type``)
        when it is not a system, user or assistant message of text."""
        where = f"messages[{i}]"
        if self.role not in ROLES:
            raise RequestRejected(
                f"{where}.role: {self.role!r} is not supported; use one of {', '.join(ROLES)}",
                f"{where}.role",
            )
        content = self.content
        if content is None:  # OpenAI's assistant message that only called tools
            content = ""
        elif isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text":
                    raise RequestRejected(
                        f"{where}.content[{j}].type: {part.type!r} is not supported; only "
                        "text parts are",
                        f"{where}.content[{j}].type",
                    )
                if part.text is None:
                    raise RequestRejected(
                        f"{where}.content[{j}].text is required", f"{where}.content[{j}].text"
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        plain: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            plain["name"] = self.name
        return plain


TOP_LOGPROBS_NEEDS_LOGPROBS = {
    "if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
    "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
}
"""The rule across two fields, in JSON Schema (the route refuses the rest with 400)."""


class ChatCompletionRequest(UnsupportedFields):
    """OpenAI's chat request. ``max_completion_tokens`` wins over the older ``max_tokens``;
    with neither, the answer may fill the context (``max_model_len`` less the prompt).
    ``top_logprobs`` needs ``logprobs: true``, as OpenAI says (and the schema)."""

    model_config = ConfigDict(json_schema_extra=TOP_LOGPROBS_NEEDS_LOGPROBS)

    # _shared(...) is the completions body's own field type (one definition for both bodies):
    # a type mypy cannot read from a call, hence the valid-type ignores of these fields
    model: _shared("model")  # type: ignore[valid-type]
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: OutputLimit | None = Field(
        None, description="Prompt tokens + this must fit max_model_len."
    )
    max_tokens: OutputLimit | None = Field(
        None, description="The older name of max_completion_tokens (which wins)."
    )
    temperature: _shared("temperature")  # type: ignore[valid-type]
    top_p: _shared("top_p")  # type: ignore[valid-type]
    top_k: _shared("top_k")  # type: ignore[valid-type]
    seed: _shared("seed")  # type: ignore[valid-type]
    stop: _shared("stop")  # type: ignore[valid-type]
    stream: _shared("stream")  # type: ignore[valid-type]
    stream_options: _shared("stream_options")  # type: ignore[valid-type]
    ignore_eos: _shared("ignore_eos")  # type: ignore[valid-type]
    n: _shared("n")  # type: ignore[valid-type]
    logprobs: StrictBool | None = Field(
        False,
        description="Log-probabilities of each output token, from the model's raw "
        "distribution (before temperature, top-k, top-p).",
    )
    top_logprobs: LogprobsCount | None = Field(
        None, description="With logprobs: the N most likely tokens at each position."
    )
    add_generation_prompt: StrictBool = Field(
        True, description="Extension: end the prompt with the template's assistant header."
    )

    _model_unicode = field_validator("model")(CompletionRequest._model_unicode.__func__)
    _stops_as_list = field_validator("stop")(CompletionRequest._stops_as_list.__func__)

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as plain dicts for the template (see ``ChatMessage.plain``)."""
        return [message.plain(i) for i, message in enumerate(self.messages)]

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def output_limit_field(self) -> str:
        """The field that set the limit (named in a refusal)."""
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="The token's text as UTF-8 bytes.")


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(
        description="The top_logprobs most likely tokens, most likely first."
    )


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: str | int | None = Field(
        None, description="Extension: the stop string or token id that ended the text."
    )


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed answer: each choice's first carries
    ``delta.role``; the last of each its ``finish_reason``; with
    ``stream_options.include_usage``, a last chunk with no choices carries ``usage`` (and
    with ``continuous_usage_stats`` every chunk its choice's usage so far)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
