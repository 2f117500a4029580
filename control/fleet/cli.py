"""``servedeck fleet restart``: a rolling restart of the engine replicas from the command line
(``POST /admin/fleet/restart``); with ``--wait`` it follows ``/admin/state``'s ``restart``
until the last replica is replaced. The transport, the flags and the exit statuses are
control/core/rest_cli.py's."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from control.core import rest_cli

POLL_S = 1.0


def progress(restart: dict[str, Any]) -> str:  # Any: the admin API's JSON, read by key
    line = (
        f"restart {restart['id']} {restart['state']}: "
        f"{len(restart['left'])}/{len(restart['replicas'])} replaced"
    )
    if restart.get("draining"):
        line += f", {restart['draining']} draining"
    if restart.get("error"):
        line += f": {restart['error']}"
    return line


def cmd_restart(args: argparse.Namespace, target: rest_cli.Target) -> None:
    restart = rest_cli.call(target, "POST", "/admin/fleet/restart").json()
    print(
        f"restart {restart['id']}: {', '.join(restart['replicas'])} one at a time "
        f"(policy version {restart['version']}, drain timeout {restart['drain_timeout_s']:g} s)"
    )
    if not args.wait:
        return
    last = ""
    while restart["state"] == "running":
        time.sleep(POLL_S)
        restart = rest_cli.call(target, "GET", "/admin/state").json()["restart"]
        if (line := progress(restart)) != last:
            print(line, flush=True)
            last = line
    if restart["state"] == "failed":
        raise rest_cli.CliError(1, f"the restart failed: {restart['error']}")
    print(f"done: {', '.join(restart['started'])}")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], func: Callable[..., int]
) -> None:
    """``servedeck fleet restart``; ``func`` runs the parsed args."""
    command = rest_cli.add_group(sub, "fleet", "the engine replicas (--replicas)", func)
    p = command("restart", "restart every replica, one at a time, draining each", cmd_restart)
    p.add_argument("--wait", action="store_true", help="follow it until it is done")
