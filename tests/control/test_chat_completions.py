"""``POST /v1/chat/completions`` against a real server, through the official ``openai`` client
and plain HTTP: the text equals a completion of the rendered prompt, streaming, stop strings,
the output limits, logprobs and ``n``, and every refusal naming its field."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from control.chat.template import load_chat_template
from engine.checkpoint import BOS
from tests.control.support import ServerProcess, sse_events

MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "The quick brown fox jumps over the lazy dog and"},
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def sdk(main_server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{main_server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def rendered(model_dir: Path, messages: list[dict]) -> str:
    template = load_chat_template(model_dir)
    assert template is not None
    return template.render(messages)


def complete(client: httpx.Client, prompt: str, **extra) -> dict:
    """A completion of the rendered prompt: its BOS is the one /v1/completions adds."""
    assert prompt.startswith(BOS)
    body = {"prompt": prompt.removeprefix(BOS), "max_tokens": MAX_TOKENS, "temperature": 0}
    response = client.post("/v1/completions", json={**body, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def chat(client: httpx.Client, **fields) -> httpx.Response:
    """A chat request sent as ASCII JSON (so a lone surrogate travels as ``\\ud800``)."""
    body = {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    headers = {"Content-Type": "application/json"}
    return client.post("/v1/chat/completions", content=json.dumps(body), headers=headers)


def refused(response: httpx.Response, param: str) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    return error


def test_plain_chat_equals_completion_of_rendered_prompt(
    sdk: openai.OpenAI, client: httpx.Client, tiny_model_dir: Path
) -> None:
    answer = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=MAX_TOKENS, temperature=0
    )
    expected = complete(client, rendered(tiny_model_dir, MESSAGES))
    assert answer.object == "chat.completion"
    assert answer.id.startswith("chatcmpl-")
    assert answer.model == "tiny"
    [choice] = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected["choices"][0]["text"]
    assert choice.finish_reason == expected["choices"][0]["finish_reason"]
    assert answer.usage is not None
    usage = answer.usage
    want = expected["usage"]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        want["prompt_tokens"],
        want["completion_tokens"],
        want["total_tokens"],
    )
    assert usage.prompt_tokens_details is not None  # the same prompt, once more: more hits
    assert (
        usage.prompt_tokens_details.cached_tokens <= want["prompt_tokens_details"]["cached_tokens"]
    )


def test_streamed_chat_through_the_openai_client(
    sdk: openai.OpenAI, client: httpx.Client, tiny_model_dir: Path
) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    expected = complete(client, rendered(tiny_model_dir, MESSAGES))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    first, *middle, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in middle)
    assert (
        "".join(c.choices[0].delta.content or "" for c in middle)
        == (expected["choices"][0]["text"])
    )
    assert [c.choices[0].finish_reason for c in middle][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in middle[:-1])
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.total_tokens == expected["usage"]["total_tokens"]


def test_stream_without_usage_ends_with_done(client: httpx.Client) -> None:
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "stream": True},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(list(response.iter_lines()))
    assert events[-1] == "[DONE]"
    assert all(e["usage"] is None and len(e["choices"]) == 1 for e in events[:-1])


def test_text_parts_and_names_render_like_strings(
    client: httpx.Client, tiny_model_dir: Path
) -> None:
    parts = [
        {
            "role": "user",
            "name": "ada",
            "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}],
        },
    ]
    response = chat(client, messages=parts)
    assert response.status_code == 200, response.text
    plain = [{"role": "user", "content": "Hello\nworld"}]
    expected = complete(client, rendered(tiny_model_dir, plain))
    assert response.json()["choices"][0]["message"]["content"] == expected["choices"][0]["text"]
    usage, want = response.json()["usage"], expected["usage"]
    assert (
        usage.pop("prompt_tokens_details")["cached_tokens"]
        <= (
            want.pop("prompt_tokens_details")["cached_tokens"]  # the same prompt, once more
        )
    )
    assert usage == want


def test_stop_strings_end_the_answer(client: httpx.Client) -> None:
    full = chat(client).json()["choices"][0]["message"]["content"]
    # the first place where two characters (not blank) appear for the first time
    cut = next(
        p
        for p in range(1, len(full) - 1)
        if full[p : p + 2].strip() and full.find(full[p : p + 2]) == p
    )
    stop = full[cut : cut + 2]
    choice = chat(client, stop=[stop, "never-there"]).json()["choices"][0]
    assert choice["message"]["content"] == full[:cut]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop


def test_max_completion_tokens_wins_over_max_tokens(client: httpx.Client) -> None:
    both = chat(client, max_tokens=9, max_completion_tokens=3, ignore_eos=True).json()
    assert both["usage"]["completion_tokens"] == 3
    assert both["choices"][0]["finish_reason"] == "length"
    older = chat(client, max_tokens=5, ignore_eos=True).json()
    assert older["usage"]["completion_tokens"] == 5


def test_output_limits_are_bounded(client: httpx.Client) -> None:
    refused(chat(client, max_completion_tokens=0), "max_completion_tokens")
    refused(chat(client, max_tokens=0), "max_tokens")
    error = refused(chat(client, max_completion_tokens=10**6), "max_completion_tokens")
    assert error["code"] == "context_length_exceeded"
    error = refused(
        chat(
            client,
            max_tokens=None,
            max_completion_tokens=None,
            messages=[{"role": "user", "content": "word " * 5000}],
        ),
        "messages",
    )
    assert error["code"] == "context_length_exceeded"


def test_logprobs_equal_the_completions_ones(
    sdk: openai.OpenAI, client: httpx.Client, tiny_model_dir: Path
) -> None:
    answer = sdk.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    expected = complete(client, rendered(tiny_model_dir, MESSAGES), max_tokens=5, logprobs=3)
    legacy = expected["choices"][0]["logprobs"]
    content = answer.choices[0].logprobs.content
    assert [t.token for t in content] == legacy["tokens"]
    assert [t.logprob for t in content] == pytest.approx(legacy["token_logprobs"], abs=1e-6)
    for token, top in zip(content, legacy["top_logprobs"], strict=True):
        assert len(token.top_logprobs) == 3
        assert {t.token: t.logprob for t in token.top_logprobs}.items() <= top.items()
        assert token.bytes == list(token.token.encode("utf-8"))
    plain = chat(client, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert all(t["top_logprobs"] == [] for t in plain)
    assert chat(client).json()["choices"][0]["logprobs"] is None


def test_streamed_logprobs_and_n_choices(client: httpx.Client) -> None:
    whole = chat(client, n=2, logprobs=True, top_logprobs=1).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert whole["choices"][0]["message"] == whole["choices"][1]["message"]  # greedy
    body = {
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 1,
        "stream": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = sse_events(list(response.iter_lines()))[:-1]
    for index in (0, 1):
        choices = [c for e in events for c in e["choices"] if c["index"] == index]
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        assert (
            "".join(c["delta"]["content"] for c in choices)
            == (whole["choices"][index]["message"]["content"])
        )
        streamed = [t for c in choices if c["logprobs"] for t in c["logprobs"]["content"]]
        assert streamed == whole["choices"][index]["logprobs"]["content"]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "function", "content": "x"}], "messages[0].role"),  # tool is served
        (
            [
                {"role": "user", "content": "a"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "b"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                },
            ],
            "messages[1].content[1].type",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"content": "no role"}], "messages"),
        ([{"role": "user", "content": "\ud800"}], "messages"),
    ],
)
def test_bad_messages_name_the_field(client: httpx.Client, messages: list, param: str) -> None:
    refused(chat(client, messages=messages), param)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool_choice", "required"),  # without tools (tools are served: test_tools.py)
        ("presence_penalty", 0.5),
        ("frequency_penalty", -1.0),
        ("logit_bias", {"42": 5}),
        ("top_logprobs", 2),  # without logprobs: true
        ("top_logprobs", 21),
        ("n", 0),
        ("temperature", 2.5),
    ],
)
def test_refused_fields(client: httpx.Client, field: str, value: object) -> None:
    refused(chat(client, **{field: value}), field)


def test_default_values_of_refused_fields_are_accepted(sdk: openai.OpenAI) -> None:
    answer = sdk.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=2,
        presence_penalty=0,
        frequency_penalty=0,
        logit_bias={},
        response_format={"type": "text"},
        user="load-tester",
        seed=7,
        top_p=0.9,
        extra_body={"tools": []},
    )
    assert answer.choices[0].message.content is not None


def test_unknown_model_is_404(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)


def checkpoint_copy(tiny_model_dir: Path, folder: Path, template: str | None) -> Path:
    """The tiny checkpoint with its template replaced (None: removed)."""
    shutil.copytree(tiny_model_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template")
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def strict_servers(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A server whose checkpoint has no template, one whose template refuses some messages."""
    root = tmp_path_factory.mktemp("chat-templates")
    alternating = (
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 is even) %}"
        "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    servers = []
    for name, template in (("none", None), ("alternating", alternating)):
        model = checkpoint_copy(tiny_model_dir, root / name, template)
        (workdir := root / f"{name}-work").mkdir()
        servers.append(ServerProcess(model, workdir, [], {}))
        servers[-1].start()
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


def test_no_template_and_a_refusing_template_answer_400(
    strict_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    none, alternating = strict_servers
    sdk = openai.OpenAI(base_url=f"{none.url}/v1", api_key="x", max_retries=0)
    with sdk, pytest.raises(openai.BadRequestError) as missing:
        sdk.chat.completions.create(model="none", messages=MESSAGES, max_tokens=2)
    assert missing.value.code == "chat_template_missing"
    assert "chat_template" in missing.value.message
    with alternating.client() as http:
        ok = chat(http, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert ok.status_code == 200, ok.text
        error = refused(chat(http, messages=MESSAGES), "messages")
    assert error["code"] == "chat_template_error"
    assert "roles must alternate user/assistant" in error["message"]
