"""Tokenizing a long prompt never stalls the server: it runs on a worker thread, so
``GET /health`` answers at once meanwhile (issue 11, defect 3).

The tiny checkpoint's cheap byte bound (``max_model_len`` x its longest token) refuses long
text before tokenizing. This server's tokenizer has one very long added token, which widens
that bound past the body limit, so a 3.5 MB prompt really is tokenized (seconds of work)
before the engine refuses it as longer than ``max_model_len``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from tests.control.support import TOKEN, ServerProcess
from tests.control.test_hostile_inputs import JSON, assert_openai_error

LONG_TOKEN_CHARS = 100_000


@pytest.fixture(scope="module")
def wide_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    model = tmp_path_factory.mktemp("wide-model") / "tiny-wide"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken("\u2603" * LONG_TOKEN_CHARS)])
    tokenizer.save(str(model / "tokenizer.json"))
    server = ServerProcess(
        model, tmp_path_factory.mktemp("wide-server"), ["--admin-token", TOKEN], {}
    )
    server.start()
    yield server
    server.stop()


def test_health_stays_fast_while_a_long_prompt_is_tokenized(wide_server: ServerProcess) -> None:
    body = json.dumps({"prompt": "hello world, this is a text. " * 120_000})
    probes: list[float] = []
    with wide_server.client() as http, ThreadPoolExecutor(1) as pool:
        assert http.get("/health").status_code == 200
        refused = pool.submit(http.post, "/v1/completions", content=body, headers=JSON)
        while not refused.done():
            started = time.monotonic()
            assert http.get("/health").status_code == 200
            probes.append(time.monotonic() - started)
            time.sleep(0.02)
        response = refused.result()
    error = assert_openai_error(response, 400, "prompt")
    assert "max_model_len" in error["message"]
    assert len(probes) >= 20, "the prompt was not tokenized: the test measures nothing"
    assert max(probes) < 0.5, probes
