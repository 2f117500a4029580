"""Tool calls in the model's text: the two formats served (Hermes/Qwen's ``<tool_call>`` JSON
and Llama 3's bare JSON), which one a chat template uses, the fallback prompt for templates
that cannot render tools, the grammar text that forces a call, and the parser that turns the
model's text back into calls (whole, or as a stream arrives).

Formats (vLLM's ``--tool-call-parser`` names):

- ``hermes`` (Hermes, Qwen2/2.5/3): each call is ``<tool_call>\\n{"name": NAME, "arguments":
  {...}}\\n</tool_call>``; text outside the blocks is the message's content; a tool's answer
  goes back as ``<tool_response>`` text (the template's own way, or the fallback's).
- ``llama3_json`` (Llama 3.1/3.2): the answer is ``{"name": NAME, "parameters": {...}}`` (calls
  separated by ``; ``, optionally after ``<|python_tag|>``); an answer that does not start so
  is plain content.

A template whose source uses the ``tools`` variable renders the tools itself (transformers'
``apply_chat_template(tools=...)``): its format is ``llama3_json`` when it speaks of
``<|python_tag|>`` or ``ipython`` (Llama 3's), otherwise ``hermes``. A template without a tools
branch (SmolLM2's, ``servedeck init-model``'s) gets the fallback: the tools in a system message
(``FALLBACK_INTRO``, then one JSON line per tool) saying how to call them in the format, and
the conversation's tool calls and tool answers written as text (``fallback_conversation``).
The server's ``--tool-call-parser`` overrides the template's format.

Plain data only (no pydantic, no engine): the route validates the request
(control/api/tools.py) and the answer's choices use ``ToolCallParser``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

ToolFormat = Literal["hermes", "llama3_json"]
"""How the model writes its calls (vLLM's parser names)."""
TOOL_FORMATS: tuple[str, ...] = get_args(ToolFormat)
DEFAULT_FORMAT: ToolFormat = "hermes"
"""The format of a template that does not say (and of the fallback)."""
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
LLAMA3_SEPARATOR = "; "
FALLBACK_INTRO = (
    "You can call functions to help answer. Each function, as a JSON schema of its arguments:"
)
FALLBACK_CALL = {
    "hermes": "To call a function, answer with one block per call, and nothing else:\n"
    + CALL_OPEN
    + '\n{"name": "<function name>", "arguments": <the arguments as a JSON object>}\n'
    + CALL_CLOSE,
    "llama3_json": "To call a function, answer with only this JSON (several calls "
    'separated by "; "):\n{"name": "<function name>", "parameters": <the arguments as a '
    "JSON object>}",
}
"""The fallback system message's last paragraph, by format."""
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"


@dataclass(frozen=True, slots=True)
class Function:
    """A tool the request offers: its name, description and parameters' JSON schema."""

    name: str
    description: str | None
    parameters: dict[str, Any]  # Any: a user's JSON Schema; the calls' arguments are JSON too

    def as_tool(self) -> dict[str, Any]:
        """OpenAI's ``{"type": "function", "function": {...}}``, as templates receive it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call parsed from the model's text: ``arguments`` is JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    """The model's text as an assistant message: its content (None when only calls) and
    its calls in order."""

    content: str | None
    calls: tuple[ToolCall, ...]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def template_format(source: str) -> ToolFormat:
    """The call format a chat template that renders tools expects of the model."""
    if PYTHON_TAG in source or "ipython" in source:
        return "llama3_json"
    return DEFAULT_FORMAT


def call_text(name: str, arguments: Any, fmt: ToolFormat) -> str:
    """One call written in ``fmt`` (the text the grammar forces and the parser reads)."""
    key = "parameters" if fmt == "llama3_json" else "arguments"
    body = json.dumps({"name": name, key: arguments}, ensure_ascii=False)
    return body if fmt == "llama3_json" else f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def fallback_conversation(
    messages: list[dict[str, Any]], functions: list[Function], fmt: ToolFormat
) -> list[dict[str, Any]]:
    """The conversation for a template without a tools branch: the tools (when any) in the
    first system message (one is added in front without one), each assistant's calls as text
    after its content, and each tool answer as a user message ``<tool_response>\\n...\\n
    </tool_response>``. Every message keeps only ``role`` and ``content`` (and ``name``)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            out.append({"role": "user", "content": f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"})
            continue
        calls = message.get("tool_calls") or []
        if calls:
            texts = [
                call_text(c["function"]["name"], c["function"]["arguments"], fmt) for c in calls
            ]
            joiner = LLAMA3_SEPARATOR if fmt == "llama3_json" else "\n"
            content = "\n".join(filter(None, [content, joiner.join(texts)]))
        plain = {"role": role, "content": content}
        if "name" in message:
            plain["name"] = message["name"]
        out.append(plain)
    if functions:
        listed = "\n".join(json.dumps(f.as_tool(), ensure_ascii=False) for f in functions)
        prompt = f"{FALLBACK_INTRO}\n{listed}\n\n{FALLBACK_CALL[fmt]}"
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def call_grammar(
    functions: list[Function],
    fmt: ToolFormat,
    parallel: bool,
    json_rule: Callable[[dict[str, Any]], str],
) -> str:
    """Lark text (llguidance's dialect) of an answer that is only calls of ``functions``
    (one, or with ``parallel`` one or more), each call's arguments valid against its
    function's parameters: ``json_rule(schema)`` writes the ``%json`` rule of a schema
    (engine.grammar.json_rule, with the server's JSON spacing). The call's frame is literal
    text, so the name is exact and the arguments' schema stays the root of its own
    ``$ref``s."""
    key = "parameters" if fmt == "llama3_json" else "arguments"
    rules = []
    for i, function in enumerate(functions):
        head = json.dumps({"name": function.name, key: 0}, ensure_ascii=False)[:-2]
        if fmt == "hermes":
            head = f"{CALL_OPEN}\n{head}"
        tail = "}" if fmt == "llama3_json" else "}\n" + CALL_CLOSE
        rules.append(f"call{i}: {json.dumps(head)} args{i} {json.dumps(tail)}")
        rules.append(f"args{i}: {json_rule(function.parameters)}")
    calls = " | ".join(f"call{i}" for i in range(len(functions)))
    separator = json.dumps(LLAMA3_SEPARATOR if fmt == "llama3_json" else "\n")
    start = f"start: call ({separator} call)*" if parallel else "start: call"
    return "\n".join([start, f"call: {calls}", *rules])


def _call_of(value: Any) -> ToolCall | None:
    """A parsed JSON value as a call: an object with a string ``name`` and an object of
    ``arguments`` (or Llama's ``parameters``); anything else is not a call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))


_HERMES_BLOCK = re.compile(
    re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|\Z)", re.DOTALL
)


def _parse_hermes(text: str) -> ParsedAnswer:
    """Every ``<tool_call>`` block that holds a call (the last may lack its close at the end
    of the text); a block that does not parse stays in the content."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    last = 0
    for match in _HERMES_BLOCK.finditer(text):
        try:
            call = _call_of(json.loads(match.group(1)))
        except ValueError:
            call = None
        if call is None:
            continue
        calls.append(call)
        kept.append(text[last : match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return ParsedAnswer(content or None, tuple(calls))


def _parse_llama3(text: str) -> ParsedAnswer:
    """Calls only where the whole answer is calls (after an optional ``<|python_tag|>``):
    JSON objects separated by ``;``; otherwise the text is content."""
    body = text.strip()
    body = body.removeprefix(PYTHON_TAG).lstrip()
    if not body.startswith("{"):
        return ParsedAnswer(text or None, ())
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = 0
    while position < len(body):
        try:
            value, position = decoder.raw_decode(body, position)
        except ValueError:
            return ParsedAnswer(text or None, ())
        call = _call_of(value)
        if call is None:
            return ParsedAnswer(text or None, ())
        calls.append(call)
        rest = body[position:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        position = len(body) - len(rest)
    return ParsedAnswer(None, tuple(calls))


def parse_answer(text: str, fmt: ToolFormat) -> ParsedAnswer:
    """The model's whole text as content and calls."""
    return _parse_hermes(text) if fmt == "hermes" else _parse_llama3(text)


class ToolCallParser:
    """One choice's text as it streams: ``feed`` returns the content that can be sent now
    (text that cannot be part of a call); the rest is held until ``finish``, which parses it.
    Hermes: text before a ``<tool_call>`` (or before what may be its start) streams; from
    there everything is held. Llama 3: an answer whose first characters are ``{`` or
    ``<|python_tag|>`` is held whole; any other streams. Calls are therefore sent whole, in
    the choice's last chunk (as vLLM's non-incremental parsers do)."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self._held = ""
        self._holding = False
        self._streaming = False

    def feed(self, delta: str) -> str:
        if self._streaming:
            return delta
        self._held += delta
        if self._holding:
            return ""
        if self.fmt == "llama3_json":
            start = self._held.lstrip()
            if not start:
                return ""
            if start.startswith("{") or _may_start(start, PYTHON_TAG):
                self._holding = True
                return ""
            self._streaming = True
            text, self._held = self._held, ""
            return text
        found = self._held.find(CALL_OPEN)
        if found >= 0:
            self._holding = True
            text, self._held = self._held[:found], self._held[found:]
            return text
        keep = _partial_suffix(self._held, CALL_OPEN)
        cut = len(self._held) - keep
        text, self._held = self._held[:cut], self._held[cut:]
        return text

    def finish(self) -> ParsedAnswer:
        """The held text parsed (its content is what was not sent yet)."""
        held, self._held = self._held, ""
        if not self._holding:
            return ParsedAnswer(held or None, ())
        return parse_answer(held, self.fmt)


def _may_start(text: str, tag: str) -> bool:
    return text.startswith(tag) or tag.startswith(text)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (0 when none)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
