"""Without the distributed extra, ``--replicas`` says what to install (no Ray needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from control import cli


def test_replicas_without_ray_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_has_ray", lambda: False)
    assert cli.main(["serve", "--replicas", "2"]) == 2
    assert "pip install 'servedeck[distributed]'" in capsys.readouterr().err


def test_the_server_imports_ray_only_when_replicas_are_asked_for() -> None:
    """The app, the runtime and the fleet's own modules load without touching ray."""
    code = (
        "import sys, control.server, control.runtime, control.fleet.fleet, "
        "control.api.routes.admin_state; print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
