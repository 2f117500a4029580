"""Fixtures of the control-plane tests: one shared server for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.support import TOKEN, ServerProcess


@pytest.fixture(scope="session")
def main_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The shared server: test-only routes on, a 128-block pool and at most 2 waiting."""
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("main-server"),
        ["--admin-token", TOKEN, "--max-waiting", "2", "--served-model-name", "tiny"],
        {"SERVEDECK_TESTING": "1"},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client(main_server: ServerProcess) -> Iterator[httpx.Client]:
    with main_server.client() as http:
        yield http
