"""What the tests of ``servedeck policy|schedule|guardrail`` share: a server of the module's
own (they count versions, schedules or decisions, no other test may add any), the command
pointed at it through the environment, and the command run in this process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from control.cli import main
from tests.control.support import TOKEN, ServerProcess


def server_fixture(name: str, *args: str) -> Callable[..., Iterator[ServerProcess]]:
    """A module-scoped ``server`` fixture: a server of the module's own, in a folder ``name``,
    started with ``args`` besides the admin token."""

    @pytest.fixture(scope="module")
    def server(
        tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ServerProcess]:
        proc = ServerProcess(
            tiny_model_dir, tmp_path_factory.mktemp(name), ["--admin-token", TOKEN, *args], {}
        )
        proc.start()
        yield proc
        proc.stop()

    return server


@pytest.fixture(autouse=True)
def cli_target(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Autouse where imported: only ``SERVEDECK_URL`` and ``SERVEDECK_ADMIN_TOKEN`` set,
    naming the module's server."""
    for name in [n for n in os.environ if n.startswith("SERVEDECK_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SERVEDECK_URL", server.url)
    monkeypatch.setenv("SERVEDECK_ADMIN_TOKEN", TOKEN)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``servedeck ARGV...`` in this process; (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err
