"""``servedeck up``: the server in a child process, the admin console in this one."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time

import httpx

from control.core.config import Settings
from control.server import AdminTokenError, resolve_admin_token

NOT_FORWARDED = {"command", "func", "no_console", "admin_token", "api_key"}
"""Secrets travel to the child in its environment, never on its command line (ps)."""
STARTUP_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 15.0


def serve_argv(args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "control.cli", "serve"]
    for key, value in vars(args).items():
        if value is None or key in NOT_FORWARDED:
            continue
        flag = key.replace("_", "-")
        if isinstance(value, bool):  # a switch (argparse.BooleanOptionalAction): no value
            argv.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            argv += [f"--{flag}", str(value)]
    return argv


def client_url(settings: Settings) -> str:
    return settings.local_url()


def wait_ready(
    url: str, child: subprocess.Popen[bytes], timeout: float = STARTUP_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the server exited with status {child.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the server at {url} was not ready after {timeout:.0f} s")


def stop(child: subprocess.Popen[bytes], drain_timeout_s: float = 0.0) -> int:
    """SIGINT: the server drains (up to ``drain_timeout_s``) and stops; killed if it hangs."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(drain_timeout_s + STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
    return child.wait()


def _console_available() -> bool:
    try:
        return importlib.util.find_spec("tui.app") is not None
    except ModuleNotFoundError:  # no tui package at all
        return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def up(settings: Settings, args: argparse.Namespace, console: bool = True) -> int:
    # Ctrl-C and SIGTERM stop both, even where SIGINT came in ignored (a background job of a
    # non-interactive shell starts that way).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        token = resolve_admin_token(settings)
    except AdminTokenError as exc:
        print(f"servedeck up: {exc}", file=sys.stderr)
        return 2
    env = {**os.environ, "SERVEDECK_ADMIN_TOKEN": token}  # not on the command line (ps)
    if settings.api_key is not None and settings.api_key_file is None:
        # (a key file is forwarded as its path: its named keys are the child's to read)
        env["SERVEDECK_API_KEY"] = settings.api_key.get_secret_value()
    with_console = console and _console_available()
    # The console owns the terminal: the server then logs to a file beside the database.
    log_path = settings.db_path().with_suffix(".server.log")
    log = open(log_path, "ab") if with_console else None  # noqa: SIM115 - closed below
    # A session of its own: Ctrl-C reaches this process only, which stops the child once.
    child = subprocess.Popen(
        serve_argv(args),
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
    )
    url = client_url(settings)
    failed = False
    try:
        if log is not None:
            print(f"starting the server at {url} (log: {log_path}) ...", flush=True)
        wait_ready(url, child)
        print(f"servedeck is serving at {url}", flush=True)
        if with_console:
            from tui.app import run_console

            run_console(url=url, token=token)
        else:
            if console:
                print("the admin console is not installed; serving until Ctrl-C", flush=True)
            child.wait()
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        print(f"servedeck up: {exc}", file=sys.stderr)
        failed = True
    finally:
        status = stop(child, settings.drain_timeout_s)
        if log is not None:
            log.close()
    return 1 if failed else status
