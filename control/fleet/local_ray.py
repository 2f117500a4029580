"""A Ray instance of the server's own, on loopback (no Ray import at module level: Ray reads
its environment once, at import, so ``connect`` sets it first)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAMESPACE = "servedeck"
CONNECT_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0
LOCAL_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "token",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
"""A local instance: usage stats off, Ray's token required (``~/.ray/auth_token``, which this
process then sends), and the node address on loopback (Ray's single-machine mode, which it
otherwise keeps for macOS and Windows)."""


class LocalRay:
    """A Ray instance of this server's own, on loopback: ``ray start --head --block`` as a child
    in its own session (a Ctrl-C to the server does not reach it; ``stop`` ends it). Not
    ``ray.init()`` here: the model loads on a thread, and Ray's daemons die with the thread that
    started them."""

    def __init__(self, num_cpus: int) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        ray = Path(sys.executable).with_name("ray")
        argv = [
            str(ray) if ray.exists() else "ray",
            "start", "--head", "--block",
            f"--port={port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--num-cpus={num_cpus}",
        ]  # fmt: skip
        env = {**os.environ, **LOCAL_ENV}
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


def connect(address: str, local: LocalRay | None = None) -> None:
    """Join the Ray instance at ``address`` (retrying while a local one starts)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray's C++ handler would end this process 3 s after a SIGTERM; the server drains instead.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    if local is not None:
        os.environ.update(LOCAL_ENV)
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
