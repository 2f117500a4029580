"""Admin token hygiene: short or empty tokens refused at start, a token file (flag or
environment) with a warning when others may read it, and the token never in the output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from control.core.config import Settings
from control.server import AdminTokenError, resolve_admin_token
from tests.control.support import ServerProcess

GOOD = "file-token-0123456789abcdef"


def serve(tmp_path: Path, model: Path, *args: str, env: dict[str, str] | None = None):
    """``servedeck serve`` that must refuse before loading anything."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
    argv = [sys.executable, "-m", "control.cli", "serve", "--model", str(model)]
    argv += ["--db", str(tmp_path / "t.db"), "--port", "9", *args]
    return subprocess.run(
        argv,
        cwd=tmp_path,
        env=base | {"SERVEDECK_HOME": str(tmp_path)} | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--admin-token", "abc123xyz"], {}, "shorter than 16 characters"),
        (["--admin-token", ""], {}, "is empty"),
        ([], {"SERVEDECK_ADMIN_TOKEN": ""}, "is empty"),
        ([], {"SERVEDECK_ADMIN_TOKEN": "abc123xyz"}, "shorter than 16 characters"),
    ],
)
def test_short_or_empty_token_is_refused_with_a_clear_error(
    tmp_path: Path, tiny_model_dir: Path, args: list[str], env: dict[str, str], words: str
) -> None:
    result = serve(tmp_path, tiny_model_dir, *args, env=env)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert "abc123xyz" not in result.stdout + result.stderr
    assert not (tmp_path / "t.db").exists()  # refused before anything started


def test_token_file_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "token"
    path.write_text(GOOD + "\n")
    path.chmod(0o600)
    monkeypatch.setenv("SERVEDECK_ADMIN_TOKEN_FILE", str(path))
    assert resolve_admin_token(Settings(db=tmp_path / "x.db")) == GOOD


@pytest.mark.parametrize(("content", "words"), [("short\n", "shorter than 16"), ("", "empty")])
def test_token_file_with_a_bad_token_is_refused(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(AdminTokenError, match=words):
        resolve_admin_token(Settings(db=tmp_path / "x.db", admin_token_file=path))


def test_missing_token_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(AdminTokenError, match="cannot read"):
        resolve_admin_token(Settings(db=tmp_path / "x.db", admin_token_file=missing))


def test_token_file_readable_by_others_warns_without_the_token(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "token"
    path.write_text(GOOD + "\n")
    path.chmod(0o644)
    server = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token-file", str(path)], {})
    server.start()
    try:
        with server.client() as http:
            ok = http.get("/admin/policy", headers={"Authorization": f"Bearer {GOOD}"})
            assert ok.status_code == 200
            assert "/admin/policy" in str(ok.url)
    finally:
        server.stop()
    log = server.log()
    assert f"the admin token file {path} is open to group or others (mode 644)" in log
    assert GOOD not in log
