"""``servedeck serve --replicas 2`` on a machine that never ran Ray: an empty ``HOME``, no
``~/.ray``. The server's own Ray instance brings its own token, which only this user can read,
which no command line, environment or log shows, which Ray enforces, and which goes with the
instance."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.support import TOKEN, ServerProcess
from tests.fleet.conftest import REPLICAS
from tests.fleet.support import all_up

LOG_BYTES = 4 << 20
"""How much of each Ray log file is searched for the token (Ray's logs are a few MB)."""


def processes() -> Iterator[tuple[int, bytes, bytes]]:
    """Every process this user may read: (pid, command line, environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield (
                int(entry.name),
                (entry / "cmdline").read_bytes(),
                (entry / "environ").read_bytes(),
            )
        except OSError:  # gone meanwhile, or not ours
            continue


def parent(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("empty-home")


@pytest.fixture(scope="module")
def own_ray_server(
    ray_instance: object,  # skips (or fails in CI) without ray, like every fleet test
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    home: Path,
) -> Iterator[ServerProcess]:
    """A server that starts its own Ray instance (no ``--ray-address``) with ``HOME`` empty
    and no Ray token of any kind in its environment."""
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("own-ray"),
        ["--admin-token", TOKEN, "--replicas", str(REPLICAS), "--served-model-name", "tiny"],
        {"HOME": str(home), "RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": ""},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_path(own_ray_server: ServerProcess) -> Path:
    """The token file the server's instance was started with: from the environment of its
    ``ray start`` child (a process's ``environ`` is the one it was started with)."""
    assert own_ray_server.proc is not None
    children = [
        pid
        for pid, cmdline, _ in processes()
        if b"start\0--head" in cmdline and parent(pid) == own_ray_server.proc.pid
    ]
    assert len(children) == 1, "the server did not start a Ray instance of its own"
    named = environment(children[0]).get("RAY_AUTH_TOKEN_PATH")
    assert named, "the server's instance was started without a token file of its own"
    return Path(named)


def test_serve_with_replicas_is_ready_from_an_empty_home(
    own_ray_server: ServerProcess, home: Path
) -> None:
    with own_ray_server.client() as http:
        assert len(all_up(http, timeout=60)) == REPLICAS
        body = {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
    assert not (home / ".ray").exists()  # nothing was looked for or left in HOME


def test_the_instance_token_is_private_and_its_own(token_path: Path, home: Path) -> None:
    token = token_path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token), "no token, or not a fresh random one"
    assert not token_path.is_relative_to(home)
    for path in (token_path, token_path.parent):
        info = path.stat()
        assert info.st_uid == os.getuid()
        assert stat.S_IMODE(info.st_mode) & 0o077 == 0, f"{path} is readable by others"


def test_the_token_is_in_no_command_line_environment_or_log(
    own_ray_server: ServerProcess, token_path: Path
) -> None:
    token = token_path.read_bytes()
    seen = 0
    log_dirs: set[Path] = set()
    for pid, cmdline, environ in processes():
        assert token not in cmdline, f"the token is in process {pid}'s command line"
        assert token not in environ, f"the token is in process {pid}'s environment"
        if str(token_path).encode() in environ:
            seen += 1  # Ray's daemons and replicas read the file the path names
            for arg in cmdline.split(b"\0"):
                if arg.startswith((b"--log_dir=", b"--logs-dir=")):
                    log_dirs.add(Path(arg.partition(b"=")[2].decode()))
    assert seen >= 3, "the server and its Ray daemons should all name the token file"
    assert log_dirs, "no Ray daemon of this instance names its log directory"
    assert token.decode() not in own_ray_server.log()
    for directory in log_dirs:
        for log in directory.rglob("*"):
            if log.is_file():
                with log.open("rb") as file:
                    assert token not in file.read(LOG_BYTES), f"the token is in {log}"


def test_ray_refuses_a_client_without_the_token(
    own_ray_server: ServerProcess, token_path: Path, tmp_path: Path
) -> None:
    """The instance enforces the token: a driver with another token is refused (Ray retries
    for about 10 s, then gives up with a ConnectionError; its log names the token)."""
    assert own_ray_server.proc is not None
    gcs = [
        arg.split("=", 1)[1]
        for _, cmdline, environ in processes()
        if str(token_path).encode() in environ
        for arg in cmdline.decode(errors="replace").split("\0")
        if arg.startswith("--gcs-address=")
    ]
    assert gcs, "no daemon of the instance names its address"
    code = (
        "import ray\n"
        f"try:\n    ray.init(address={gcs[0]!r}, log_to_driver=False)\n"
        "except Exception as error:\n    print(type(error).__name__)\n"
        "else:\n    print('connected')\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    env["RAY_AUTH_TOKEN"] = "0" * 64  # another token
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1:] == ["ConnectionError"], out.stderr[-2000:]
    assert "InvalidAuthToken" in out.stderr  # refused for its token, not for being late


def test_the_token_goes_with_the_instance(own_ray_server: ServerProcess, token_path: Path) -> None:
    assert own_ray_server.proc is not None
    own_ray_server.proc.send_signal(signal.SIGTERM)
    assert own_ray_server.proc.wait(60) == 0
    assert not token_path.parent.exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{own_ray_server.url}/health", timeout=2)
