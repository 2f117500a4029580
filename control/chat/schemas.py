"""``POST /v1/chat/completions``: the request and the answers (``chat.completion`` and, when
streamed, ``chat.completion.chunk``), as OpenAI writes them.

The sampling fields are ``CompletionRequest``'s own (same types, bounds and descriptions,
taken from its model fields), and so are the fields accepted only at their default
(``UnsupportedFields``). Messages are typed loosely enough that the route can name the exact
field at fault (``messages[1].content[0].type``) in its 400.
"""

from __future__ import annotations

import json
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
    model_validator,
)
from pydantic.json_schema import JsonDict

from control.api.openai_fields import UnsupportedFields, _json_integer
from control.schemas.completions import CompletionRequest, LogprobsCount, Usage, _valid_unicode
from engine.errors import RequestRejected

OutputLimit = Annotated[StrictInt, Field(ge=1), BeforeValidator(_json_integer)]
"""A token count >= 1 (the bound before the validator, so the JSON schema says ``minimum``
inside the nullable field)."""
ROLES = ("system", "user", "assistant", "tool")
"""The roles a message may have."""


def _shared(name: str) -> Any:  # Any: a type built at run time (an Annotated form)
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


class CalledFunction(BaseModel):
    name: StrictStr
    arguments: StrictStr = Field(description="The arguments, a JSON object as text.")


class MessageToolCall(BaseModel):
    """A call an earlier assistant message made (sent back in the conversation)."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


CALLS_ARE_AN_ASSISTANTS: JsonDict = {
    "if": {
        "properties": {"tool_calls": {"type": "array", "minItems": 1}},
        "required": ["tool_calls"],
    },
    "then": {"properties": {"role": {"const": "assistant"}}},
}
"""Only an assistant message has calls, in JSON Schema (the route refuses the rest with 400)."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(json_schema_extra=CALLS_ARE_AN_ASSISTANTS)

    role: StrictStr = Field(json_schema_extra={"enum": list(ROLES)})
    content: StrictStr | list[ContentPart] | None = Field(
        None,
        description="Text, or a list of text parts (joined with newlines); null is empty.",
    )
    name: StrictStr | None = None
    tool_calls: list[MessageToolCall] | None = Field(
        None, description="An assistant message's calls (its content may then be null)."
    )
    tool_call_id: StrictStr | None = Field(
        None, description="A tool message's answer: the call it answers."
    )

    @field_validator("content")
    @classmethod
    def _content_unicode(cls, value: object) -> object:
        return _valid_unicode(value, "content") if isinstance(value, str) else value

    @field_validator("tool_call_id")
    @classmethod
    def _id_unicode(cls, value: str | None) -> str | None:
        return None if value is None else _valid_unicode(value, "tool_call_id")

    def plain(self, i: int) -> dict[str, Any]:  # Any: the template's context, JSON
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
        if self.tool_calls:
            plain["tool_calls"] = self._calls(where)
        if self.role == "tool" and self.tool_call_id is not None:
            plain["tool_call_id"] = self.tool_call_id
        return plain

    def _calls(self, where: str) -> list[dict[str, Any]]:
        """An assistant's calls as templates take them (transformers', vLLM's): ``arguments``
        parsed into an object (text that is not JSON stays text, as vLLM leaves it)."""
        if self.role != "assistant":
            raise RequestRejected(
                f"{where}.tool_calls: only an assistant message has tool calls",
                f"{where}.tool_calls",
            )
        calls = []
        for j, call in enumerate(self.tool_calls or []):
            field = f"{where}.tool_calls[{j}]"
            try:
                arguments: Any = json.loads(call.function.arguments)  # the client's JSON
            except ValueError:
                arguments = call.function.arguments
            function = {"name": call.function.name, "arguments": arguments}
            try:
                _valid_unicode(json.dumps(function, ensure_ascii=False), "the call")
            except ValueError as exc:
                raise RequestRejected(f"{field}.function: {exc}", f"{field}.function") from None
            calls.append({"id": call.id, "type": "function", "function": function})
        return calls


TOP_LOGPROBS_NEEDS_LOGPROBS: JsonDict = {
    "if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
    "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
}
"""The rule across two fields, in JSON Schema (the route refuses the rest with 400)."""


FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
"""OpenAI's rule for a function's name."""
MAX_TOOLS = 128
"""Tools one request may offer (OpenAI's own bound)."""


class FunctionSpec(BaseModel):
    """A tool's function. Typed loosely where the route names the field at fault
    (``tools[0].function.name``: control/api/tools.py)."""

    model_config = ConfigDict(json_schema_extra={"required": ["name"]})

    name: Annotated[
        StrictStr | None,
        WithJsonSchema({"type": "string", "pattern": FUNCTION_NAME_PATTERN}),
    ] = Field(None, description="Letters, digits, _ and -, at most 64; unique among the tools.")
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = Field(  # Any: a user's JSON Schema
        None,
        description="The arguments' JSON Schema (absent: none); bounded and compiled as "
        "response_format's schema is.",
    )
    strict: StrictBool | None = Field(
        None, description="Accepted either way: a forced call always follows the schema."
    )


class ToolSpec(BaseModel):
    type: StrictStr = Field(json_schema_extra={"enum": ["function"]})
    function: FunctionSpec

    @model_validator(mode="after")
    def _tool_unicode(self) -> ToolSpec:
        _valid_unicode(json.dumps(self.model_dump(), ensure_ascii=False), "the tool")
        return self


class NamedFunction(BaseModel):
    name: StrictStr


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoiceMode = Literal["none", "auto", "required"]


FORCED_CALL_NEEDS_TOOLS: JsonDict = {
    "if": {
        "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
        "required": ["tool_choice"],
    },
    "then": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
}
"""``tool_choice`` required or a named function needs tools, in JSON Schema."""


class ChatCompletionRequest(UnsupportedFields):
    """OpenAI's chat request. ``max_completion_tokens`` wins over the older ``max_tokens``;
    with neither, the answer may fill the context (``max_model_len`` less the prompt).
    ``top_logprobs`` needs ``logprobs: true``, as OpenAI says (and the schema); so does a
    forced tool call need tools."""

    model_config = ConfigDict(
        json_schema_extra={"allOf": [TOP_LOGPROBS_NEEDS_LOGPROBS, FORCED_CALL_NEEDS_TOOLS]}
    )

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
    tools: list[ToolSpec] | None = Field(
        None,
        max_length=MAX_TOOLS,
        description="Functions the model may call, rendered through the chat template (or "
        "the documented fallback system message); see docs/api.md.",
    )
    tool_choice: ToolChoiceMode | NamedToolChoice | None = Field(
        None,
        description="none, auto (the default with tools), required, or "
        '{"type": "function", "function": {"name"}}; required and a named function are '
        "enforced by a grammar.",
    )
    parallel_tool_calls: StrictBool | None = Field(
        None, description="Whether one answer may make several calls (default true)."
    )

    # the completions body's own validators (their classmethods' functions, which mypy's view
    # of a classmethod does not show)
    _model_unicode = field_validator("model")(CompletionRequest._model_unicode.__func__)  # type: ignore[attr-defined]
    _stops_as_list = field_validator("stop")(CompletionRequest._stops_as_list.__func__)  # type: ignore[attr-defined]

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


def _absent(value: object) -> bool:
    return value is None


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="The arguments, a JSON object as text.")


class ChatToolCall(BaseModel):
    id: str = Field(description="call_ and 24 hex digits.")
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatToolCallDelta(ChatToolCall):
    index: int = Field(description="The call's place among the choice's calls.")


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="Null when the answer is only tool calls.")
    tool_calls: list[ChatToolCall] | None = Field(
        None, description="The calls the answer made (absent when none).", exclude_if=_absent
    )


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
    tool_calls: list[ChatToolCallDelta] | None = Field(
        None,
        description="The choice's calls, each whole, in its last chunk (absent otherwise).",
        exclude_if=_absent,
    )


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
