"""Fixtures of the control-plane tests: one shared server for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.support import TOKEN, ServerProcess

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
