"""A ``servedeck serve`` child on 127.0.0.1 for the scripts that drive a real server (soak,
the policy-engine run): its own port, database and home folder, ready when ``/ready`` is 200."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

READY_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    model_dir: Path,
    workdir: Path,
    admin_token: str,
    args: list[str],
    extra_env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start the server with ``args`` after the model, port, database and token, with
    ``extra_env`` added to its environment; the log goes to ``workdir/server.log``."""
    port = free_port()
    argv = [
        sys.executable, "-m", "control.cli", "serve",
        "--model", str(model_dir), "--port", str(port), "--db", str(workdir / "servedeck.db"),
        "--admin-token", admin_token, "--log-level", "warning", *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
    env |= {"SERVEDECK_HOME": str(workdir), "TOKENIZERS_PARALLELISM": "false"}
    env |= extra_env or {}
    log = (workdir / "server.log").open("w")
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {workdir}/server.log")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server not ready after {READY_TIMEOUT_S:.0f} s")


def stop_server(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
