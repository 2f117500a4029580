"""``GET /admin/requests/{id}`` against real servers: one started with ``--expose-text`` (this
module's) and the shared one without it, whose refusal says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from tokenizers import Tokenizer

from control.chat.template import load_chat_template
from tests.control.support import ADMIN, TOKEN, ServerProcess, sse_events, state, wait_for

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def text_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("text-server"),
        ["--admin-token", TOKEN, "--expose-text"],
        {},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(text_server: ServerProcess) -> Iterator[httpx.Client]:
    with text_server.client() as client:
        yield client


def detail(http: httpx.Client, seq_id: str) -> httpx.Response:
    return http.get(f"/admin/requests/{quote(seq_id, safe='')}", headers=ADMIN)


def kept(http: httpx.Client, seq_id: str) -> dict:
    response = detail(http, seq_id)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_streamed_completion_keeps_its_prompt_and_the_text_it_streamed(
    http: httpx.Client,
) -> None:
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        events = sse_events(list(response.iter_lines()))
    chunks = [e for e in events if e != "[DONE]"]
    seen = kept(http, chunks[0]["id"])
    assert seen["prompt"] == PROMPT and not seen["prompt_truncated"]
    assert seen["output"] == "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert (seen["state"], seen["finish_reason"]) == ("finished", "length")
    assert seen["finished_at"] is not None and seen["started_at"] <= seen["finished_at"]
    assert state(http)["text_exposed"] is True


def test_each_engine_sequence_of_n_and_of_a_batch_has_its_own_entry(http: httpx.Client) -> None:
    prompts = [PROMPT, "jumps over the lazy dog"]
    answer = http.post("/v1/completions", json={"prompt": prompts, "max_tokens": 6, "n": 2})
    assert answer.status_code == 200, answer.text
    rid, choices = answer.json()["id"], answer.json()["choices"]
    # prompt i's engine request is <id>-<i>; its second sequence a fork of it, <id>-<i>#1
    for index, seq_id in enumerate([f"{rid}-0", f"{rid}-0#1", f"{rid}-1", f"{rid}-1#1"]):
        seen = kept(http, seq_id)
        assert seen["request_id"] == seq_id.split("#")[0]
        assert seen["prompt"] == prompts[index // 2]
        assert seen["output"] == choices[index]["text"] and seen["state"] == "finished"


def test_a_token_id_prompt_is_kept_decoded(http: httpx.Client, text_server: ServerProcess) -> None:
    tokenizer = Tokenizer.from_file(str(text_server.model_dir / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT, add_special_tokens=False).ids
    answer = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 3})
    assert answer.status_code == 200, answer.text
    assert kept(http, answer.json()["id"])["prompt"] == tokenizer.decode(
        ids, skip_special_tokens=False
    )


def test_a_chat_keeps_the_messages_as_the_template_rendered_them(
    http: httpx.Client, text_server: ServerProcess
) -> None:
    messages = [{"role": "user", "content": "Say something about foxes."}]
    body = {"messages": messages, "max_tokens": 5, "temperature": 0}
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    template = load_chat_template(text_server.model_dir)
    assert template is not None
    seen = kept(http, answer.json()["id"])
    assert seen["prompt"] == template.render(messages)
    assert seen["output"] == answer.json()["choices"][0]["message"]["content"]


def test_a_running_request_shows_its_output_growing_and_a_dropped_stream_ends_it(
    http: httpx.Client, text_server: ServerProcess
) -> None:
    body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with (
        text_server.client() as streaming,
        streaming.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        first = next(e for e in sse_events([next(lines)]) if e != "[DONE]")
        seq_id = first["id"]
        running = kept(http, seq_id)
        assert running["state"] == "running" and running["finish_reason"] is None
        assert running["output"].startswith(first["choices"][0]["text"])
        assert seq_id in {r["id"] for r in state(http)["requests"]}
        later = wait_for(lambda: len(kept(http, seq_id)["output"]) > len(running["output"]))
        assert later
    ended = wait_for(lambda: (seen := kept(http, seq_id))["state"] == "finished" and seen)
    assert ended["finish_reason"] == "abort" and ended["output_chars"] < 1000 * 16


def test_an_unknown_id_is_404_naming_it(http: httpx.Client) -> None:
    response = detail(http, "cmpl-nothing#9")
    assert response.status_code == 404
    assert "'cmpl-nothing#9'" in response.json()["detail"]


def test_the_route_needs_the_admin_token(http: httpx.Client) -> None:
    assert http.get("/admin/requests/x").status_code == 401


def test_without_expose_text_the_route_says_the_server_was_started_without_it(
    client: httpx.Client,
) -> None:
    answer = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert answer.status_code == 200, answer.text
    response = client.get(f"/admin/requests/{answer.json()['id']}", headers=ADMIN)
    assert response.status_code == 409
    assert "started without --expose-text" in response.json()["detail"]
    assert state(client)["text_exposed"] is False
