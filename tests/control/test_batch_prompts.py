"""Batched prompts in ``/v1/completions`` (a list of texts or of token-id lists, as OpenAI, vLLM
and lm-evaluation-harness send them) and ``usage.prompt_tokens_details.cached_tokens``,
against a real server of their own: every prompt answered as if sent alone (choice
``prompt × n + j``), the usage summed, and the batch admitted whole or refused whole."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.control.support import ADMIN, TOKEN, ServerProcess, sse_events, state, wait_for

MAX_WAITING = 4
MAX_BATCH = 5
STALL_S = 4.0
"""Long enough to queue two requests and send a batch while the engine is held."""
BLOCK_SIZE = 16
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog and", "Once upon"]
TOKEN_LISTS = [[5, 17, 300, 42, 7, 1999, 64], [11, 12, 13], [900, 901, 902, 903, 904]]


@pytest.fixture(scope="module")
def batch_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A small waiting queue and batch bound, one context per request's tokens, and a quick
    stall watchdog (``/ready`` shows when the engine is held)."""
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("batch-server"),
        [
            *("--admin-token", TOKEN, "--served-model-name", "tiny"),
            *("--max-waiting", str(MAX_WAITING), "--max-batch-prompts", str(MAX_BATCH)),
            *("--max-request-tokens", "1", "--stall-timeout-s", "0.5"),
        ],
        {"SERVEDECK_TESTING": "1"},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(batch_server: ServerProcess) -> Iterator[httpx.Client]:
    with batch_server.client() as client:
        yield client


def body(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": 8, "temperature": 0, **extra}


def complete(http: httpx.Client, prompt: Any, **extra: Any) -> dict[str, Any]:
    response = http.post("/v1/completions", json=body(prompt, **extra))
    assert response.status_code == 200, response.text
    return response.json()


def streamed(http: httpx.Client, prompt: Any, **extra: Any) -> list[dict[str, Any]]:
    payload = body(prompt, stream=True, stream_options={"include_usage": True}, **extra)
    with http.stream("POST", "/v1/completions", json=payload) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(list(response.iter_lines()))
    assert events[-1] == "[DONE]"
    return events[:-1]


def counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


def summed(answers: list[dict[str, Any]]) -> tuple[int, int, int]:
    totals = [counts(answer["usage"]) for answer in answers]
    return (sum(t[0] for t in totals), sum(t[1] for t in totals), sum(t[2] for t in totals))


@pytest.mark.parametrize("prompts", [TEXTS, TOKEN_LISTS], ids=["texts", "token-lists"])
def test_a_batch_answers_each_prompt_as_alone_numbered_prompt_times_n(
    http: httpx.Client, prompts: list[Any]
) -> None:
    alone = [complete(http, prompt, n=2) for prompt in prompts]
    answer = complete(http, prompts, n=2)
    assert answer["id"].startswith("cmpl-")
    assert [c["index"] for c in answer["choices"]] == list(range(2 * len(prompts)))
    for i, single in enumerate(alone):
        for j in range(2):
            got, want = answer["choices"][2 * i + j], single["choices"][j]
            assert (got["text"], got["finish_reason"]) == (want["text"], want["finish_reason"])
    assert counts(answer["usage"]) == summed(alone)  # each prompt once, every choice's tokens


def test_a_streamed_batch_names_each_chunks_choice_and_sums_the_usage(
    http: httpx.Client,
) -> None:
    alone = [complete(http, prompt, n=2) for prompt in TOKEN_LISTS]
    *chunks, last = streamed(http, TOKEN_LISTS, n=2)
    assert len({event["id"] for event in [*chunks, last]}) == 1
    assert all(len(event["choices"]) == 1 for event in chunks)
    for i, single in enumerate(alone):
        for j in range(2):
            index = 2 * i + j
            mine = [c for e in chunks for c in e["choices"] if c["index"] == index]
            assert "".join(c["text"] for c in mine) == single["choices"][j]["text"]
            assert [c["finish_reason"] for c in mine][-1] == single["choices"][j]["finish_reason"]
    assert last["choices"] == []
    assert counts(last["usage"]) == summed(alone)


def test_echo_and_logprobs_apply_to_each_prompt_of_a_batch(http: httpx.Client) -> None:
    extra = {"echo": True, "logprobs": 2, "max_tokens": 3}
    alone = [complete(http, prompt, **extra)["choices"][0] for prompt in TEXTS[:2]]
    batch = complete(http, TEXTS[:2], **extra)["choices"]
    for got, want, prompt in zip(batch, alone, TEXTS[:2], strict=True):
        assert got["text"] == want["text"] and got["text"].startswith(prompt)
        mine, theirs = got["logprobs"], want["logprobs"]
        assert mine["tokens"] == theirs["tokens"]
        assert mine["text_offset"] == theirs["text_offset"]
        assert mine["token_logprobs"][0] is None  # the prompt's first token has none
        # (float32 in another batch: a random model's -57.69 differed by 1.8e-4)
        close = {"rel": 1e-5, "abs": 1e-4}
        assert mine["token_logprobs"] == pytest.approx(theirs["token_logprobs"], **close)
        for top, their_top in zip(
            mine["top_logprobs"][1:], theirs["top_logprobs"][1:], strict=True
        ):
            assert top == pytest.approx(their_top, **close)


def test_lm_evaluation_harness_log_likelihood_batch(http: httpx.Client) -> None:
    """What lm-evaluation-harness's ``local-completions`` sends for log-likelihoods: token-id
    lists, one token each, echoed with their logprobs (it read a 400 here before)."""
    prompts = TOKEN_LISTS[:2]
    payload = {"model": "tiny", "prompt": prompts, "max_tokens": 1, "temperature": 0}
    payload |= {"logprobs": 1, "seed": 1234, "echo": True}
    response = http.post("/v1/completions", json=payload)
    assert response.status_code == 200, response.text
    choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
    for prompt, choice in zip(prompts, choices, strict=True):
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(prompt) + 1  # the prompt's and the one
        assert logprobs["token_logprobs"][0] is None
        assert all(isinstance(lp, float) for lp in logprobs["token_logprobs"][1:])


@pytest.mark.parametrize(
    "prompt",
    [[], [""], ["a", ""], [[1], []], ["a", 1], [[1, 2], "a"], [1, [2]], [["a"]]],
    ids=["empty", "empty-text", "an-empty-text", "an-empty-list", "text-and-id", "list-and-text",
         "id-and-list", "texts-in-a-list"],
)  # fmt: skip
def test_a_malformed_batch_is_400_naming_prompt(http: httpx.Client, prompt: Any) -> None:
    response = http.post("/v1/completions", json=body(prompt))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "prompt")


def test_a_batch_past_max_batch_prompts_is_400_naming_prompt(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json=body(["x"] * (MAX_BATCH + 1)))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt"
    assert "max_batch_prompts" in error["message"] and str(MAX_BATCH) in error["message"]
    schema = http.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]
    batches = [b for b in schema["properties"]["prompt"]["anyOf"] if "maxItems" in b]
    assert [b["items"]["type"] for b in batches] == ["string", "array"]
    assert {b["maxItems"] for b in batches} == {MAX_BATCH}


def test_a_batch_with_one_prompt_too_long_is_refused_whole(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json=body([[5, 6, 7], list(range(5, 2100))]))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert "prompt 1 of the 2" in error["message"]
    assert state(http)["requests"] == []  # the short one was not queued either


def test_a_batch_whose_tokens_pass_the_request_bound_is_400(http: httpx.Client) -> None:
    """Each prompt fits the context (and the request bound, here one context), the three do
    not: the bound counts the batch whole."""
    prompts = [[7 + i] * 700 for i in range(3)]
    response = http.post("/v1/completions", json=body(prompts))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "request_too_large")
    assert state(http)["requests"] == []


class Opened:
    """A streamed request on its own thread: ``admitted`` is set once its answer's status came
    (the engine queued it: a stream's status is sent only after admission)."""

    def __init__(self, server: ServerProcess, payload: dict[str, Any]) -> None:
        self.admitted = threading.Event()
        self.status: int | None = None
        self._thread = threading.Thread(target=self._run, args=(server, payload))
        self._thread.start()

    def _run(self, server: ServerProcess, payload: dict[str, Any]) -> None:
        with (
            server.client() as client,
            client.stream("POST", "/v1/completions", json=payload) as response,
        ):
            self.status = response.status_code
            self.admitted.set()
            response.read()

    def join(self) -> int | None:
        self._thread.join(60)
        return self.status


def test_a_batch_the_queue_has_no_room_for_is_one_429_and_none_is_queued(
    http: httpx.Client, batch_server: ServerProcess
) -> None:
    before = state(http)["totals"]["requests_finished"]
    assert http.post("/admin/testing/stall", params={"seconds": STALL_S}, headers=ADMIN).is_success
    held = Opened(batch_server, body([9, 8, 7], stream=True, max_tokens=4))
    assert held.admitted.wait(30)
    wait_for(lambda: http.get("/ready").status_code == 503)  # its step is the held one
    waiting = [Opened(batch_server, body([9, 8, 7 + i], stream=True)) for i in range(2)]
    assert all(opened.admitted.wait(30) for opened in waiting)  # 2 of the 4 places taken

    response = http.post("/v1/completions", json=body([[1, 2], [3, 4], [5, 6]]))
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "queue_full" and "none was queued" in error["message"]
    assert response.headers["retry-after"]

    assert [opened.join() for opened in (held, *waiting)] == [200, 200, 200]
    after = wait_for(lambda: (s := state(http))["totals"]["requests_finished"] >= before + 3 and s)
    assert after["totals"]["requests_finished"] == before + 3 and after["requests"] == []


def test_cached_tokens_count_the_prefix_cache_hits_once_per_prompt(http: httpx.Client) -> None:
    prompt = [(37 * i) % 4000 + 50 for i in range(100)]  # this test's own tokens
    first = complete(http, prompt)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    again = complete(http, prompt, n=2)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < 100 and cached % BLOCK_SIZE == 0
    assert again["usage"]["prompt_tokens"] == 100  # the prompt once, its hits once
    *_, last = streamed(http, prompt)
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
    batch = complete(http, [prompt, prompt[:40]])
    assert batch["usage"]["prompt_tokens_details"]["cached_tokens"] == cached + 32


async def test_a_client_that_leaves_a_streamed_batch_aborts_every_prompt(
    http: httpx.Client, batch_server: ServerProcess
) -> None:
    before = state(http)["totals"]["generation_tokens"]
    long = {"max_tokens": 900, "ignore_eos": True, "stream": True}
    async with (
        batch_server.async_client() as client,
        client.stream("POST", "/v1/completions", json=body([[3, 4], [5, 6]], **long)) as response,
    ):
        assert response.status_code == 200
        received = 0
        async for line in response.aiter_lines():
            received += line.startswith("data: ")
            if received == 4:
                break  # leaving the block closes the connection mid-stream

    def released() -> dict[str, Any] | None:
        snap = state(http)
        return snap if not snap["requests"] and snap["kv"]["used"] == 0 else None

    snap = wait_for(released, timeout=20)
    assert snap["totals"]["generation_tokens"] - before < 900  # neither ran to its end
