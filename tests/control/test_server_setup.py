"""Start-up of the server: 503 while loading, the admin token, and ``servedeck up``."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from bench.child_server import free_port
from control import context
from control.core.config import Settings
from control.server import create_app, resolve_admin_token, token_file
from tests.control.support import wait_for


def test_health_is_503_while_loading_and_after_a_failed_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def slow_failing_load(*_args, **_kwargs):
        release.wait(10)
        raise RuntimeError("no such model")

    monkeypatch.setattr(context, "build_runtime", slow_failing_load)
    app = create_app(Settings(db=tmp_path / "x.db", model=tmp_path), "t")
    with TestClient(app) as client:
        assert client.get("/health").status_code == 503
        assert client.get("/health").json() == {"status": "loading"}
        response = client.post("/v1/completions", json={"prompt": "hi"})
        assert (response.status_code, response.json()["error"]["message"]) == (
            503,
            "the model is still loading",
        )
        admin = client.get("/admin/policy", headers={"Authorization": "Bearer t"})
        assert admin.status_code == 503
        release.set()
        wait_for(lambda: app.state.ctx.load_error is not None, timeout=10)
        assert client.get("/health").json() == {"status": "failed"}


def test_generated_admin_token_is_printed_once_and_kept_owner_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(db=tmp_path / "state" / "servedeck.db")
    token = resolve_admin_token(settings)
    path = token_file(settings.db_path())
    assert path.parent == settings.db_path().parent
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == token
    assert len(token) >= 32
    assert token in capsys.readouterr().out

    assert resolve_admin_token(settings) == token  # a restart reads the file ...
    assert token not in capsys.readouterr().out  # ... and does not print the token again


def test_given_admin_token_wins_and_writes_no_file(tmp_path: Path) -> None:
    settings = Settings(db=tmp_path / "servedeck.db", admin_token="given-token-of-20ch")
    assert resolve_admin_token(settings) == "given-token-of-20ch"
    assert not token_file(settings.db_path()).exists()


def test_up_serves_until_interrupted(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
    env["SERVEDECK_HOME"] = str(tmp_path)
    argv = [
        sys.executable, "-m", "control.cli", "up", "--no-console",
        "--model", str(tiny_model_dir), "--port", str(port),
        "--db", str(tmp_path / "up.db"), "--num-kv-blocks", "64", "--num-threads", "1",
    ]  # fmt: skip
    up = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []

    def read_output() -> None:
        for line in up.stdout or ():
            lines.append(line)

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("serving at" in line for line in lines), timeout=120, interval=0.2)
        assert httpx.get(f"{url}/health", timeout=2).status_code == 200
        token = token_file(tmp_path / "up.db").read_text().strip()
        admin = httpx.get(f"{url}/admin/policy", headers={"Authorization": f"Bearer {token}"})
        assert admin.status_code == 200
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        reader.join(10)
    assert up.returncode == 0, "".join(lines)
    assert f"servedeck is serving at {url}\n" in lines
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2)


def test_up_passes_secrets_to_the_server_in_its_environment_not_its_command_line() -> None:
    from control.cli import build_parser
    from control.up import serve_argv

    args = build_parser().parse_args(
        ["up", "--admin-token", "admin-token-0123456789", "--api-key", "api-key-0123456789"]
    )
    argv = serve_argv(args)
    assert "admin-token-0123456789" not in argv
    assert "api-key-0123456789" not in argv
    assert "--api-key" not in argv and "--admin-token" not in argv


def test_up_forwards_switches_to_the_server_as_flags_without_a_value() -> None:
    from control.cli import build_parser
    from control.up import serve_argv

    argv = serve_argv(build_parser().parse_args(["up", "--expose-text", "--port", "9"]))
    assert "--expose-text" in argv and "True" not in argv
    assert argv[argv.index("--port") + 1] == "9"
    assert "--no-expose-text" in serve_argv(build_parser().parse_args(["up", "--no-expose-text"]))
    assert not any("expose" in a for a in serve_argv(build_parser().parse_args(["up"])))
