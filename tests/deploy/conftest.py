"""One real server for the deploy-kit tests (the tiny checkpoint, a reclaim sweep a second)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control.support import TOKEN, ServerProcess


@pytest.fixture(scope="package")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("deploy"),
        ["--admin-token", TOKEN, "--reclaim-interval-s", "1"],
        {},
    )
    process.start()
    yield process
    process.stop()
