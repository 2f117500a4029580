"""The OpenAI fields operators rely on, against a real server (issue 15): ``n``, ``logprobs``,
``echo`` (with logprobs: the prompt's too), ``user``, the fields refused unless at their
default, ``/v1/models`` as vLLM gives it, and the official ``openai`` client on all of them."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.control.support import ServerProcess, sse_events, state, wait_for

PROMPT = "The quick brown fox jumps over the lazy dog and"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def offline(tiny_model_dir: Path) -> RequestOutput:
    """The same request offline, greedy, with 3 logprobs."""
    llm = LLM(tiny_model_dir, num_kv_blocks=64, num_threads=1)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=3)
    return llm.generate([PROMPT], params)[0]


def body(**extra) -> dict:
    return {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


def post(client: httpx.Client, **extra) -> dict:
    response = client.post("/v1/completions", json=body(**extra))
    assert response.status_code == 200, response.text
    return response.json()


def stream(client: httpx.Client, **extra) -> list[dict]:
    payload = body(stream=True, stream_options={"include_usage": True}, **extra)
    with client.stream("POST", "/v1/completions", json=payload) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(list(response.iter_lines()))
    assert events[-1] == "[DONE]"
    return events[:-1]


def joined(chunks: list[dict], index: int) -> str:
    return "".join(c["text"] for e in chunks for c in e["choices"] if c["index"] == index)


def test_n_choices(client: httpx.Client, offline: RequestOutput) -> None:
    answer = post(client, n=3)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert all(c["text"] == offline.text for c in answer["choices"])
    prompt_tokens = len(offline.prompt_token_ids)
    usage = answer["usage"]
    cached = usage.pop("prompt_tokens_details")["cached_tokens"]
    assert usage == {
        "prompt_tokens": prompt_tokens,  # the prompt once
        "completion_tokens": 3 * len(offline.token_ids),  # every choice's tokens
        "total_tokens": prompt_tokens + 3 * len(offline.token_ids),
    }
    assert 0 <= cached < prompt_tokens  # the prompt's hits once too


def test_n_choices_streamed(client: httpx.Client, offline: RequestOutput) -> None:
    events = stream(client, n=2)
    *chunks, usage = events
    assert {c["index"] for e in chunks for c in e["choices"]} == {0, 1}
    assert all(len(e["choices"]) == 1 for e in chunks)
    for index in (0, 1):
        assert joined(chunks, index) == offline.text
        reasons = [c["finish_reason"] for e in chunks for c in e["choices"] if c["index"] == index]
        assert reasons[-1] == offline.finish_reason and set(reasons[:-1]) <= {None}
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 2 * len(offline.token_ids)
    assert usage["usage"]["prompt_tokens"] == len(offline.prompt_token_ids)


def check_logprobs(logprobs: dict, offline: RequestOutput, width: int) -> None:
    expected = offline.logprobs or []
    assert len(logprobs["tokens"]) == len(expected) == len(offline.token_ids)
    for value, entry in zip(logprobs["token_logprobs"], expected, strict=True):
        assert value == pytest.approx(entry.logprob, abs=1e-4)
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0
    for i, token in enumerate(logprobs["tokens"][:-1]):
        assert offsets[i + 1] == offsets[i] + len(token)
    for top, token, entry in zip(
        logprobs["top_logprobs"], logprobs["tokens"], expected, strict=True
    ):
        assert token in top  # the chosen token is always listed
        assert width <= len(top) <= width + 1
        values = list(top.values())[:width]
        assert values == sorted(values, reverse=True)
        assert values == pytest.approx([v for _, v in entry.top[:width]], abs=1e-4)


def test_logprobs(client: httpx.Client, offline: RequestOutput) -> None:
    choice = post(client, logprobs=3)["choices"][0]
    assert choice["text"] == offline.text
    check_logprobs(choice["logprobs"], offline, 3)
    assert post(client)["choices"][0]["logprobs"] is None


def test_logprobs_streamed_equal_the_whole(client: httpx.Client, offline: RequestOutput) -> None:
    whole = post(client, logprobs=3)["choices"][0]["logprobs"]
    chunks = [c for e in stream(client, logprobs=3)[:-1] for c in e["choices"]]
    merged = {key: [v for c in chunks for v in c["logprobs"][key]] for key in whole}
    assert merged["tokens"] == whole["tokens"]
    for got, want in zip(merged["top_logprobs"], whole["top_logprobs"], strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    assert merged["text_offset"] == whole["text_offset"]
    assert merged["token_logprobs"] == pytest.approx(whole["token_logprobs"], abs=1e-4)
    for chunk in chunks:  # each chunk carries the logprobs of its own tokens
        assert len(chunk["logprobs"]["tokens"]) == len(chunk["logprobs"]["token_logprobs"])


def test_echo(client: httpx.Client, offline: RequestOutput) -> None:
    assert post(client, echo=True)["choices"][0]["text"] == PROMPT + offline.text
    events = stream(client, echo=True, n=2)
    first = [next(c for e in events[:-1] for c in e["choices"] if c["index"] == i) for i in (0, 1)]
    assert all(c["text"].startswith(PROMPT) for c in first)
    assert joined(events[:-1], 1) == PROMPT + offline.text
    tokens = list(offline.prompt_token_ids)
    echoed = post(client, prompt=tokens, echo=True)["choices"][0]["text"]
    assert echoed.endswith(offline.text) and len(echoed) > len(offline.text)


def test_echo_with_logprobs_lists_the_prompt_tokens_first(
    client: httpx.Client, tiny_model_dir: Path
) -> None:
    llm = LLM(tiny_model_dir, num_kv_blocks=64, num_threads=1)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=2, prompt_logprobs=2)
    offline = llm.generate([PROMPT], params)[0]
    choice = post(client, echo=True, logprobs=2)["choices"][0]
    assert choice["text"] == PROMPT + offline.text
    logprobs = choice["logprobs"]
    num_prompt = len(offline.prompt_token_ids)
    assert len(logprobs["tokens"]) == num_prompt + len(offline.token_ids)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = [e.logprob for e in (offline.prompt_logprobs or []) + (offline.logprobs or [])]
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    assert all(len(top) in (2, 3) for top in logprobs["top_logprobs"][1:])
    events = stream(client, echo=True, logprobs=2, n=2)
    for index in (0, 1):
        chunks = [c for e in events[:-1] for c in e["choices"] if c["index"] == index]
        assert chunks[0]["text"].startswith(PROMPT)
        assert chunks[0]["logprobs"]["token_logprobs"][0] is None
        merged = [v for c in chunks for v in c["logprobs"]["token_logprobs"]]
        assert merged[1:] == pytest.approx(logprobs["token_logprobs"][1:], abs=1e-4)
        offsets = [v for c in chunks for v in c["logprobs"]["text_offset"]]
        assert offsets == logprobs["text_offset"]


REFUSED = [
    ("best_of", 2),
    ("presence_penalty", 0.5),
    ("frequency_penalty", -1.0),
    ("logit_bias", {"50": 5}),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("functions", [{"name": "f"}]),
    ("suffix", "after"),
    ("n", 17),
    ("logprobs", 21),
]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f for f, _ in REFUSED])
def test_unsupported_values_are_refused_naming_the_field(
    client: httpx.Client, field: str, value: object, streamed: bool
) -> None:
    response = client.post("/v1/completions", json=body(**{field: value}, stream=streamed))
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["param"] == field
    assert field in error["message"]


DEFAULTS = {
    "presence_penalty": 0,
    "frequency_penalty": 0.0,
    "best_of": 1,
    "logit_bias": {},
    "user": "load-tester-7",
    "suffix": None,
    "response_format": {"type": "text"},
    "tools": [],
    "functions": None,
    "n": 1,
    "echo": False,
    "logprobs": None,
    "seed": 5,
}


@pytest.mark.parametrize("streamed", [False, True])
def test_default_values_are_accepted(
    client: httpx.Client, offline: RequestOutput, streamed: bool
) -> None:
    if streamed:
        assert joined(stream(client, **DEFAULTS)[:-1], 0) == offline.text
    else:
        assert post(client, **DEFAULTS)["choices"][0]["text"] == offline.text
    nulls = dict.fromkeys(["best_of", "presence_penalty", "logit_bias", "user", "tools"])
    assert post(client, **nulls)["choices"][0]["text"] == offline.text


def test_seeded_choices_are_reproducible(client: httpx.Client) -> None:
    seeded = {"n": 3, "temperature": 1.0, "seed": 99, "ignore_eos": True}
    first = [c["text"] for c in post(client, **seeded)["choices"]]
    assert [c["text"] for c in post(client, **seeded)["choices"]] == first


def test_models_card_is_vllms(client: httpx.Client) -> None:
    [card] = client.get("/v1/models").json()["data"]
    assert card["id"] == "tiny" and card["object"] == "model" and card["owned_by"] == "servedeck"
    assert isinstance(card["created"], int)
    assert card["root"] == "tiny" and card["parent"] is None and card["permission"] == []
    too_long = client.post("/v1/completions", json=body(max_tokens=card["max_model_len"]))
    assert too_long.status_code == 400  # the prompt + max_model_len tokens cannot fit
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


async def test_disconnect_frees_every_choice(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    payload = {
        "prompt": list(range(2900, 2940)),
        "max_tokens": 1000,
        "ignore_eos": True,
        "n": 3,
        "stream": True,
    }
    async with (
        main_server.async_client() as http,
        http.stream("POST", "/v1/completions", json=payload) as response,
    ):
        seen: set[int] = set()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                seen.add(int(line.split('"index":')[1].split(",")[0]))
            if len(seen) == 3:
                break  # every choice is running: hang up

    def released() -> dict | None:
        snap = state(client)
        return snap if not snap["requests"] and snap["kv"]["used"] == 0 else None

    wait_for(released, timeout=20)


def test_official_openai_client(main_server: ServerProcess, offline: RequestOutput) -> None:
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=f"{main_server.url}/v1", api_key="unused", max_retries=0)
    answer = api.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        n=2,
        logprobs=2,
        user="someone",
        presence_penalty=0,
        best_of=1,
    )
    assert [c.index for c in answer.choices] == [0, 1]
    assert all(c.text == offline.text for c in answer.choices)
    assert answer.choices[1].logprobs is not None
    assert len(answer.choices[1].logprobs.tokens or []) == len(offline.token_ids)
    assert answer.usage is not None and answer.usage.completion_tokens == 2 * len(offline.token_ids)
    texts = {0: "", 1: ""}
    for chunk in api.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, n=2, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == {0: offline.text, 1: offline.text}
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model="tiny", prompt=PROMPT, best_of=3)
    assert "best_of" in str(refused.value)
    [card] = api.models.list().data
    assert card.id == "tiny" and card.model_extra and card.model_extra["max_model_len"] > 0
