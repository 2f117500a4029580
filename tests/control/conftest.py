"""Fixtures of the control-plane tests: one shared server for the session, and one tool-calling
Qwen2 server for the tool and LangChain modules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.support import TOKEN, ServerProcess
from tests.control.test_tool_parser import QWEN_TOOLS_TEMPLATE
from tests.engine.test_families import write_family

MAIN_SERVER_ARGS = [
    *("--admin-token", TOKEN, "--max-waiting", "2", "--served-model-name", "tiny"),
    *("--max-request-tokens", "30000"),
]


@pytest.fixture(scope="session")
def main_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The shared server: test-only routes on, a 128-block pool, at most 2 waiting, and a token
    bound per request under 16 × the context (2,048), so that ``n`` can pass it while each
    sequence fits the context (a sequence past the context is refused as such)."""
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("main-server"),
        MAIN_SERVER_ARGS,
        {"SERVEDECK_TESTING": "1"},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client(main_server: ServerProcess) -> Iterator[httpx.Client]:
    with main_server.client() as http:
        yield http


@pytest.fixture(scope="package")
def qwen(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A random Qwen2 checkpoint (transformers' own) with the tiny tokenizer and Qwen2.5's
    chat template, tools branch included, served as ``m``: started once for the modules that
    call tools (test_tools, test_langchain)."""
    model = write_family(tmp_path_factory.mktemp("qwen") / "qwen2", "qwen2-tied", tiny_model_dir)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": QWEN_TOOLS_TEMPLATE}))
    server = ServerProcess(
        model, tmp_path_factory.mktemp("qwen-server"), ["--served-model-name", "m"], {}
    )
    server.start()
    yield server
    server.stop()
