"""control/chat/template.py renders real-style chat templates exactly as transformers'
``apply_chat_template(..., tokenize=False)`` does, finds the template where transformers does,
and the default model carries one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from control.chat.template import ChatTemplateError, find_template, load_chat_template
from engine.checkpoint import BOS, CHAT_TEMPLATE, EOS, default_model_dir, init_model

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
CHATML_QWEN = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- for tool in tools %}{{- tool | tojson }}{%- endfor %}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. ' }}
    {{- 'You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == "system" and loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
ALTERNATING = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
FEATURES = """{% set ns = namespace(turns=0, last='') %}
{% for message in messages %}
    {% set ns.turns = ns.turns + 1 %}
    {% if message.role == 'assistant' and ns.turns > 3 %}{% break %}{% endif %}
    {{ message | tojson }}
    {{ dict(role=message.role) | tojson(indent=2, sort_keys=True) }}
    [{{ message.content | length }}] {{ message.content | upper }}
{% endfor %}
turns={{ ns.turns }} year={{ strftime_now('%Y') }} pad={{ pad_token is defined }}
{% if tools is none %}no tools{% endif %}{% if add_generation_prompt %}>>{% endif %}
"""
TEMPLATES = {"llama3": LLAMA3, "chatml": CHATML_QWEN, "features": FEATURES, "ours": CHAT_TEMPLATE}
CONVERSATIONS = [
    [{"role": "user", "content": "  Hello there!  "}],
    [
        {"role": "system", "content": 'Be brief. <b>Bold</b> & "quoted"'},
        {"role": "user", "content": "Grüße aus Köln — 日本語?"},
        {"role": "assistant", "content": "Hallo!\n\nZwei Zeilen."},
        {"role": "user", "content": "And again"},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tiny_model_dir / "tokenizer.json"), bos_token=BOS, eos_token=EOS
    )


def model_with(tmp_path: Path, tiny_model_dir: Path, template: str) -> Path:
    """The tiny checkpoint's tokenizer files with ``template`` in tokenizer_config.json."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": template})
    )
    return tmp_path


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_transformers(
    hf_tokenizer: PreTrainedTokenizerFast,
    tiny_model_dir: Path,
    tmp_path: Path,
    name: str,
    conversation: int,
    add_generation_prompt: bool,
) -> None:
    messages = CONVERSATIONS[conversation]
    template = load_chat_template(model_with(tmp_path, tiny_model_dir, TEMPLATES[name]))
    assert template is not None
    expected = hf_tokenizer.apply_chat_template(
        messages,
        chat_template=TEMPLATES[name],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert template.render(messages, add_generation_prompt) == expected


def test_raise_exception_refuses_like_transformers(
    hf_tokenizer: PreTrainedTokenizerFast, tiny_model_dir: Path, tmp_path: Path
) -> None:
    template = load_chat_template(model_with(tmp_path, tiny_model_dir, ALTERNATING))
    assert template is not None
    good = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    expected = hf_tokenizer.apply_chat_template(good, chat_template=ALTERNATING, tokenize=False)
    assert (
        template.render(good, False)
        == expected
        == f"{BOS}[INST] Hi [/INST]Hello{EOS}[INST] Bye [/INST]"
    )
    bad = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi again"}]
    with pytest.raises(Exception) as theirs:
        hf_tokenizer.apply_chat_template(bad, chat_template=ALTERNATING, tokenize=False)
    with pytest.raises(ChatTemplateError) as ours:
        template.render(bad)
    assert (
        str(ours.value)
        == str(theirs.value)
        == ("Conversation roles must alternate user/assistant/user/assistant/...")
    )


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.append(1) }}",
        "{% set ns = namespace() %}{% set ns._secret = 1 %}",
        "{{ dict.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
    ],
)
def test_the_sandbox_refuses_python_internals(
    tiny_model_dir: Path, tmp_path: Path, source: str
) -> None:
    template = load_chat_template(model_with(tmp_path, tiny_model_dir, source))
    assert template is not None
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])


def test_where_the_template_is_found(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = model_with(tmp_path, tiny_model_dir, "from config")
    assert find_template(folder) == ("from config", folder / "tokenizer_config.json")
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "from json"}))
    assert find_template(folder) == ("from json", folder / "chat_template.json")
    (folder / "chat_template.jinja").write_text("from jinja")
    assert find_template(folder) == ("from jinja", folder / "chat_template.jinja")


def test_named_templates_use_default_and_special_tokens_may_be_added_tokens(
    tmp_path: Path,
) -> None:
    config = {
        "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True},
        "eos_token": "</s>",
        "pad_token": None,
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(tmp_path)
    assert template is not None
    assert template.render([]) == "<s>|</s>|"


def test_no_template_and_a_broken_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}))
    assert load_chat_template(tmp_path) is None
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match=r"chat_template\.jinja"):
        load_chat_template(broken)


def test_init_model_writes_a_template_and_an_old_default_model_gets_one(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_template(tiny_model_dir) == (
        CHAT_TEMPLATE,
        tiny_model_dir / "tokenizer_config.json",
    )
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path))
    cached = init_model(tmp_path / "models" / "tiny-seed0", "tiny", seed=0)
    config_path = cached / "tokenizer_config.json"
    old = json.loads(config_path.read_text())
    del old["chat_template"]
    config_path.write_text(json.dumps(old))  # as init_model wrote it before templates
    assert default_model_dir("tiny", seed=0) == cached
    assert json.loads(config_path.read_text()) == {**old, "chat_template": CHAT_TEMPLATE}
    template = load_chat_template(cached)
    assert template is not None
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        f"{BOS}<|user|>\nHi{EOS}\n<|assistant|>\n"
    )
