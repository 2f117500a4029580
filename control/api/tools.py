"""Tools on ``/v1/chat/completions``: the request's ``tools``, ``tool_choice`` and
``parallel_tool_calls`` checked once, here (a 400 naming the field: ``tools[1].function.name``,
``tools[0].function.parameters``, ``tool_choice.function.name``), the checkpoint's tool style
(whether its template renders tools, and the call format: control/chat/tools.py), the
conversation as that template takes it, and the grammar that forces a call (``required``, a
named function), compiled as ``response_format``'s is (control/api/structured.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from starlette.concurrency import run_in_threadpool

from control.api.structured import (
    CONFLICTING,
    INVALID_GRAMMAR,
    INVALID_SCHEMA,
    check_schema,
    compiled,
    refusal,
    schema_grammar,
)
from control.chat.schemas import FUNCTION_NAME_PATTERN, ChatCompletionRequest
from control.chat.template import find_template, takes_tools
from control.chat.tools import (
    DEFAULT_FORMAT,
    Function,
    ToolFormat,
    call_grammar,
    fallback_conversation,
    template_format,
)
from engine.front import EngineFront
from engine.grammar import json_rule, lark_grammar
from engine.sampling_params import GrammarConstraint

FUNCTION_NAME = re.compile(FUNCTION_NAME_PATTERN)
UNKNOWN_FUNCTION = "unknown_function"
"""``error.code`` of a ``tool_choice`` naming a function none of the tools has."""
DUPLICATE_FUNCTION = "duplicate_function"
"""``error.code`` of tools that name one function twice."""
# Any in this module: JSON Schemas and the template's conversation, JSON by nature
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
"""A function given without ``parameters`` takes none: its arguments are ``{}``."""


@dataclass(frozen=True, slots=True)
class ToolStyle:
    """How a checkpoint's template deals with tools: whether it renders them itself
    (``takes_tools``) and the format its model calls in."""

    takes_tools: bool
    format: ToolFormat


async def style_for(
    conversation: list[dict[str, Any]],
    tools: ToolRequest | None,
    model_dir: Path,
    parser: ToolFormat | None,
) -> ToolStyle | None:
    """The checkpoint's tool style where the request needs it (tools offered, or calls and
    tool answers in the conversation), off the event loop; None (and no cost) otherwise."""
    if tools is None and not any(m["role"] == "tool" or "tool_calls" in m for m in conversation):
        return None
    return await run_in_threadpool(tool_style, model_dir, parser)


@lru_cache(maxsize=4)
def tool_style(model_dir: Path, parser: ToolFormat | None) -> ToolStyle:
    """The template's style, read once per folder (never run: its source is parsed);
    ``parser`` (``--tool-call-parser``) overrides the template's format."""
    try:
        found = find_template(model_dir)
    except Exception:  # an unreadable file: the render says so
        found = None
    source = "" if found is None else found[0]
    takes = takes_tools(source)
    detected = template_format(source) if takes else DEFAULT_FORMAT
    return ToolStyle(takes, parser or detected)


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A request's tools, checked: every function offered, the one that must be called
    (``named``) or whether any must (``required``), and whether one answer may make several
    calls (``parallel``)."""

    functions: tuple[Function, ...]
    choice: Literal["auto", "required", "named"]
    named: str | None
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def callable(self) -> list[Function]:
        """The functions the grammar lets the answer call."""
        return [f for f in self.functions if self.named in (None, f.name)]


async def tool_request(body: ChatCompletionRequest, front: EngineFront) -> ToolRequest | None:
    """The request's tools, checked and each parameters schema compiled; None without tools
    or with ``tool_choice`` ``none`` (the answer is then plain text, and the tools are not
    shown to the model)."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise refusal("tool_choice: a forced call needs tools", "tool_choice", "invalid_value")
        return None
    functions = _functions(body)
    if choice == "none":
        return None
    if front.grammars is None:
        raise refusal(
            "tools need the model's tokenizer, and this model has none", "tools", "invalid_value"
        )
    for i, function in enumerate(functions):
        field = f"tools[{i}].function.parameters"
        constraint = schema_grammar(function.parameters, field)
        await compiled(front.grammars, constraint, field, INVALID_SCHEMA)
    parallel = body.parallel_tool_calls is not False
    if choice is None or choice == "auto":
        return ToolRequest(functions, "auto", None, parallel)
    if choice == "required":
        return ToolRequest(functions, "required", None, parallel)
    name = choice.function.name
    if name not in {f.name for f in functions}:
        raise refusal(
            f"tool_choice.function.name: {name!r} is not one of the tools' functions",
            "tool_choice.function.name",
            UNKNOWN_FUNCTION,
        )
    return ToolRequest(functions, "named", name, False)


def _functions(body: ChatCompletionRequest) -> tuple[Function, ...]:
    functions: list[Function] = []
    for i, tool in enumerate(body.tools or []):
        where = f"tools[{i}]"
        if tool.type != "function":
            raise refusal(
                f"{where}.type: {tool.type!r} is not supported; only function is",
                f"{where}.type",
                "invalid_value",
            )
        spec = tool.function
        name = spec.name
        if name is None or not FUNCTION_NAME.fullmatch(name):
            raise refusal(
                f"{where}.function.name: letters, digits, _ and - (1 to 64) are required",
                f"{where}.function.name",
                "invalid_value",
            )
        if any(f.name == name for f in functions):
            raise refusal(
                f"{where}.function.name: {name!r} is given twice",
                f"{where}.function.name",
                DUPLICATE_FUNCTION,
            )
        parameters = NO_PARAMETERS if spec.parameters is None else spec.parameters
        check_schema(parameters, f"{where}.function.parameters")
        functions.append(Function(name, spec.description, parameters))
    return tuple(functions)


def check_conflicts(tools: ToolRequest | None, constraint: GrammarConstraint | None) -> None:
    """A forced call and ``response_format``/``structured_outputs`` both constrain the
    answer: one of them only."""
    if tools is not None and tools.forced and constraint is not None:
        raise refusal(
            "tool_choice forces a tool call and response_format (or structured_outputs) "
            "constrains the answer: give one",
            "tool_choice",
            CONFLICTING,
        )


def for_template(
    conversation: list[dict[str, Any]], tools: ToolRequest | None, style: ToolStyle | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools as the template takes them: as they are for a template that
    renders tools (or without a style: nothing of tools in the request); otherwise in the
    fallback form (control/chat/tools.py)."""
    if style is None:
        return conversation, None
    functions = list(tools.functions) if tools is not None else []
    if style.takes_tools:
        return conversation, [f.as_tool() for f in functions] or None
    return fallback_conversation(conversation, functions, style.format), None


async def tool_constraint(
    tools: ToolRequest | None, style: ToolStyle | None, front: EngineFront
) -> GrammarConstraint | None:
    """The grammar of a forced call (None for ``auto``): only calls, in the style's format,
    of the callable functions, each call's arguments valid against its schema."""
    if tools is None or style is None or not tools.forced:
        return None
    assert front.grammars is not None  # tool_request refused a model without a tokenizer
    lark = call_grammar(tools.callable(), style.format, tools.parallel, json_rule)
    constraint = lark_grammar(lark, "tool_call")
    await compiled(front.grammars, constraint, "tools", INVALID_GRAMMAR)
    return constraint
