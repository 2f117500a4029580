"""control/chat/tools.py without a server: the Hermes and Llama 3 parsers (whole and streamed),
the fallback conversation, the forced-call grammar (what llguidance accepts and refuses with the
tiny tokenizer), and Qwen's tool template rendered with tools as transformers renders it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import llguidance
import pytest
from tokenizers import Tokenizer

from control.chat.template import load_chat_template, takes_tools
from control.chat.tools import (
    FALLBACK_INTRO,
    Function,
    ToolCallParser,
    ToolFormat,
    call_grammar,
    call_text,
    fallback_conversation,
    parse_answer,
    template_format,
)
from engine.checkpoint import CHAT_TEMPLATE
from engine.grammar import json_rule, lark_grammar

QWEN_TOOLS_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501  (Qwen2.5-Instruct's chat_template, as its tokenizer_config.json has it)
LLAMA31_HINT = "{% if tools %}Environment: ipython{% endif %}{{ messages[0].content }}"
WEATHER = Function(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
NOOP = Function("noop", None, {"type": "object", "properties": {}, "additionalProperties": False})
CONVERSATION = [
    {"role": "user", "content": "Weather in Rome?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
            }
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]


def test_hermes_text_parses_into_calls_and_content() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    )
    answer = parse_answer(text, "hermes")
    assert answer.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == [
        ("get_weather", {"city": "Rome"}),
        ("noop", {}),
    ]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in answer.calls)
    assert len({c.id for c in answer.calls}) == 2
    only = parse_answer('<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>', "hermes")
    assert only.content is None and len(only.calls) == 1
    unclosed = parse_answer('<tool_call>\n{"name": "noop", "arguments": {}}', "hermes")
    assert [c.name for c in unclosed.calls] == ["noop"]


@pytest.mark.parametrize(
    "text",
    [
        "no call here",
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # not an object
    ],
)
def test_hermes_text_without_a_call_stays_content(text: str) -> None:
    assert parse_answer(text, "hermes").calls == ()
    assert parse_answer(text, "hermes").content == text


def test_llama3_json_parses_only_an_answer_of_calls() -> None:
    text = (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "noop", "parameters": {}}'
    )
    answer = parse_answer(text, "llama3_json")
    assert answer.content is None
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("noop", {}),
    ]
    tagged = parse_answer('<|python_tag|>{"name": "noop", "arguments": "{}"}', "llama3_json")
    assert [(c.name, c.arguments) for c in tagged.calls] == [("noop", "{}")]
    for plain in ("It is sunny.", '{"name": "f", "parameters": {}} and more', "{broken"):
        assert parse_answer(plain, "llama3_json") == parse_answer(plain, "llama3_json")
        assert parse_answer(plain, "llama3_json").calls == ()
        assert parse_answer(plain, "llama3_json").content == plain


def streamed(pieces: list[str], fmt: ToolFormat) -> tuple[str, list[str], str | None]:
    parser = ToolCallParser(fmt)
    sent = "".join(parser.feed(piece) for piece in pieces)
    rest = parser.finish()
    return sent, [c.name for c in rest.calls], rest.content


def test_a_stream_sends_text_at_once_and_calls_whole_at_the_end() -> None:
    call = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    pieces = ["Sure, ", "<", "tool", "_call>", call[len("<tool_call>") :]]
    assert streamed(pieces, "hermes") == ("Sure, ", ["noop"], None)
    parser = ToolCallParser("hermes")
    assert parser.feed("a <b") == "a <b"
    assert parser.feed("x <tool") == "x "  # may be a call's start: held
    assert parser.feed("box>") == "<toolbox>"
    assert streamed(["It is ", "sunny."], "hermes") == ("It is sunny.", [], None)
    assert streamed([" ", '{"name": "noop", ', '"parameters": {}}'], "llama3_json") == (
        "",
        ["noop"],
        None,
    )
    assert streamed(["Sunny ", "{x}"], "llama3_json") == ("Sunny {x}", [], None)


def test_the_fallback_conversation_puts_tools_in_a_system_message() -> None:
    hermes = fallback_conversation(CONVERSATION, [WEATHER], "hermes")
    assert [m["role"] for m in hermes] == ["system", "user", "assistant", "user"]
    system = hermes[0]["content"]
    assert system.startswith(FALLBACK_INTRO)
    assert json.dumps(WEATHER.as_tool()) in system and "<tool_call>" in system
    assert hermes[2]["content"] == call_text("get_weather", {"city": "Rome"}, "hermes")
    assert hermes[3]["content"] == "<tool_response>\nsunny\n</tool_response>"
    assert all(set(m) == {"role", "content"} for m in hermes)
    with_system = [{"role": "system", "content": "Be brief."}, *CONVERSATION]
    merged = fallback_conversation(with_system, [WEATHER], "llama3_json")
    assert merged[0]["content"].startswith("Be brief.\n\n" + FALLBACK_INTRO)
    assert merged[2]["content"] == '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    assert fallback_conversation(CONVERSATION, [], "hermes")[0]["role"] == "user"


def test_templates_say_whether_and_how_they_take_tools() -> None:
    assert takes_tools(QWEN_TOOLS_TEMPLATE) and template_format(QWEN_TOOLS_TEMPLATE) == "hermes"
    assert takes_tools(LLAMA31_HINT) and template_format(LLAMA31_HINT) == "llama3_json"
    assert not takes_tools(CHAT_TEMPLATE)
    assert not takes_tools("{% for %}")  # does not parse: no tools branch


@pytest.fixture(scope="module")
def lltokenizer(tiny_model_dir: Path) -> tuple[Tokenizer, llguidance.LLTokenizer]:
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    return tokenizer, llguidance.LLTokenizer(tokenizer.to_str(), eos_token=[1])


def accepts(
    tokenizers: tuple[Tokenizer, llguidance.LLTokenizer], grammar: str, text: str
) -> tuple[bool, bool]:
    """Whether the grammar takes ``text`` whole, and whether it has ended there."""
    tokenizer, lltokenizer = tokenizers
    matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    taken = matcher.try_consume_tokens(ids) == len(ids)
    return taken, taken and matcher.is_stopped()


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
def test_the_forced_call_grammar_takes_only_valid_calls(
    lltokenizer: tuple[Tokenizer, llguidance.LLTokenizer], fmt: ToolFormat
) -> None:
    one = lark_grammar(call_grammar([WEATHER, NOOP], fmt, False, json_rule), "tool_call").grammar
    many = lark_grammar(call_grammar([WEATHER, NOOP], fmt, True, json_rule), "tool_call").grammar
    rome = call_text("get_weather", {"city": "Rome", "days": 3}, fmt)
    noop = call_text("noop", {}, fmt)
    assert accepts(lltokenizer, one, rome) == (True, True)
    assert accepts(lltokenizer, one, noop) == (True, True)
    both = ("; " if fmt == "llama3_json" else "\n").join([rome, noop])
    assert accepts(lltokenizer, many, both) == (True, False)  # another call may follow
    assert not accepts(lltokenizer, one, both)[0]
    for bad in (
        call_text("get_weather", {"city": "Oslo"}, fmt),  # not in the enum
        call_text("get_weather", {}, fmt),  # required city missing
        call_text("other", {}, fmt),  # no such function
        call_text("noop", {"x": 1}, fmt),  # no parameters
        "Sure: " + noop,  # text before the call
    ):
        assert not accepts(lltokenizer, one, bad)[0], bad


def test_qwen_template_renders_tools_as_transformers_does(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import PreTrainedTokenizerFast

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN_TOOLS_TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(tmp_path)
    assert template is not None
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    tools = [WEATHER.as_tool(), NOOP.as_tool()]
    expected = hf.apply_chat_template(
        CONVERSATION,
        tools=tools,
        chat_template=QWEN_TOOLS_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert template.render(CONVERSATION, True, None, tools) == expected
    assert '"name": "get_weather", "arguments": {"city": "Rome"}' in expected


def test_the_style_follows_the_template_unless_the_flag_says(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from control.api.tools import ToolStyle, tool_style

    def folder(name: str, template: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": template})
        )
        return path

    qwen, llama = folder("qwen", QWEN_TOOLS_TEMPLATE), folder("llama", LLAMA31_HINT)
    assert tool_style(qwen, None) == ToolStyle(True, "hermes")
    assert tool_style(llama, None) == ToolStyle(True, "llama3_json")
    assert tool_style(tiny_model_dir, None) == ToolStyle(False, "hermes")  # the fallback
    assert tool_style(tiny_model_dir, "llama3_json") == ToolStyle(False, "llama3_json")
    assert tool_style(qwen, "llama3_json") == ToolStyle(True, "llama3_json")
