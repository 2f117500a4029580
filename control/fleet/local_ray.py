"""A Ray instance of the server's own, on loopback, with a token of its own (no Ray import at
module level: Ray reads its environment once, at import, so ``connect`` sets it first)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "servedeck"
CONNECT_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0
LOCAL_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "token",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
"""A local instance: usage stats off, Ray's token required, and the node address on loopback
(Ray's single-machine mode, which it otherwise keeps for macOS and Windows)."""
TOKEN_FILE = "auth_token"
TOKEN_ENV = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""Where Ray looks for its token before ``~/.ray/auth_token``: the token itself, or a file."""


@dataclass(frozen=True)
class RayAccess:
    """What a process needs to join a Ray instance: its address and the environment Ray reads
    at import (the auth mode and the path of the token file, never the token itself)."""

    address: str
    env: Mapping[str, str]


def write_token(directory: Path) -> Path:
    """A new random token in ``directory/auth_token``, readable by this user alone (the file
    is created 0600, so no other user ever sees it, even for a moment)."""
    path = directory / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32))
    return path


class LocalRay:
    """A Ray instance of this server's own, on loopback: ``ray start --head --block`` as a child
    in its own session (a Ctrl-C to the server does not reach it; ``stop`` ends it). Not
    ``ray.init()`` here: the model loads on a thread, and Ray's daemons die with the thread that
    started them.

    Its token is its own: made at start in a private directory (0700, the file 0600) and named
    to Ray by ``RAY_AUTH_TOKEN_PATH``, so nothing depends on ``~/.ray`` (``ray start`` writes no
    token there, and a fresh ``HOME`` has none), and the token is never in a command line, an
    environment or a log. ``stop`` removes it."""

    def __init__(self, num_cpus: int) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        self.private = Path(tempfile.mkdtemp(prefix="servedeck-ray-"))  # 0700
        self.token_path = write_token(self.private)
        self.access = RayAccess(
            self.address, {**LOCAL_ENV, "RAY_AUTH_TOKEN_PATH": str(self.token_path)}
        )
        ray = Path(sys.executable).with_name("ray")
        argv = [
            str(ray) if ray.exists() else "ray",
            "start", "--head", "--block",
            f"--port={port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--num-cpus={num_cpus}",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in TOKEN_ENV} | dict(self.access.env)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - open while the instance runs
        self.proc = subprocess.Popen(
            argv, env=env, start_new_session=True, stdout=self.log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        """End the instance: its whole process group (``ray start --block`` does not stop its
        daemons on SIGTERM), SIGTERM first, SIGKILL after ``STOP_GRACE_S``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):  # SIGKILL too: daemons left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)
        self.log.close()
        shutil.rmtree(self.private, ignore_errors=True)


def connect(
    address: str, local: LocalRay | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Join the Ray instance at ``address`` (retrying while a local one starts), with ``env``
    (or the local instance's own) set first: another instance's ``RayAccess.env``; without
    either, Ray's own configuration of this process applies (``RAY_AUTH_*``, ``~/.ray``)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray's C++ handler would end this process 3 s after a SIGTERM; the server drains instead.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    join = local.access.env if local is not None else env or {}
    if join:
        for name in TOKEN_ENV:  # the token named here wins over one inherited
            os.environ.pop(name, None)
        os.environ.update(join)
    import ray

    if ray.is_initialized():
        return
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        if local is not None and local.proc.poll() is not None:
            raise RuntimeError(f"the local Ray instance did not start: {local.output()[-2000:]}")
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline or local is None:
                raise
            time.sleep(0.5)
