"""``servedeck policy ...``: the admin policy API from the command line (policy as code).

An operator keeps the setting in a YAML file in git and applies it from a pipeline. ``get``
prints the active setting as the YAML that ``apply -f`` takes back; the server decides equality
on the effective settings, so applying a file equal to what is active stores nothing and a
changed file makes exactly one version. A version number kept in a file would always be stale,
so ``--if-match N`` is a flag, never part of the file.

The transport, the flags and the exit statuses are control/core/rest_cli.py's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from control.core import rest_cli

SETTINGS_KEYS = ("policy", "queue", "memory_reserve", "reclaim_interval_s")
"""What a policy file holds (``PolicySettings``); ``reason`` may be given too. A file without
``queue`` (every file printed before it existed) keeps the queue in force."""


# Any below: the admin API's JSON bodies, read by key (the typed wire models are issue 43's
# "one wire contract", not this room's).
def settings_yaml(view: dict[str, Any]) -> str:
    """The active setting as a policy file: a comment saying which version, then the
    settings themselves (stored params only, so defaults keep following the server)."""
    status = view.get("status") or {}
    head = rest_cli.comment(
        f"servedeck policy version {view['version']} ({status.get('state', '?')}), "
        f"by {view['actor']}: {view['reason']}"
    )
    return head + rest_cli.dump_yaml({key: view["settings"][key] for key in SETTINGS_KEYS})


def _format_value(value: object) -> str:
    return json.dumps(value)


def _print_result(result: dict[str, Any]) -> None:
    if result["dry_run"]:
        print(f"dry run against version {result['version']}: nothing stored")
    elif not result.get("stored", True):
        print(f"unchanged: version {result['version']} already has these settings in effect")
    else:
        state = (result.get("status") or {}).get("state", "?")
        print(f"stored version {result['version']} ({state})")
    for change in result["diff"]:
        before, after = _format_value(change["before"]), _format_value(change["after"])
        print(f"  {change['field']}: {before} -> {after}")
    if result["dry_run"] and not result["diff"]:
        print("  no difference in the stored settings")


def _if_match(args: argparse.Namespace) -> dict[str, str]:
    return {"If-Match": str(args.if_match)} if args.if_match is not None else {}


def cmd_get(args: argparse.Namespace, target: rest_cli.Target) -> None:
    print(settings_yaml(rest_cli.call(target, "GET", "/admin/policy").json()), end="")


def cmd_apply(
    args: argparse.Namespace, target: rest_cli.Target, dry_run: bool | None = None
) -> None:
    body = rest_cli.read_yaml_file(args.file, SETTINGS_KEYS)
    body["reason"] = rest_cli.reason_of(
        args, body, f"servedeck policy apply -f {rest_cli.file_label(args.file)}"
    )
    dry = args.dry_run if dry_run is None else dry_run
    response = rest_cli.call(
        target,
        "PUT",
        "/admin/policy",
        json=body,
        params={"dry_run": "true"} if dry else None,
        headers=_if_match(args),
    )
    _print_result(response.json())


def cmd_diff(args: argparse.Namespace, target: rest_cli.Target) -> None:
    cmd_apply(args, target, dry_run=True)


def cmd_history(args: argparse.Namespace, target: rest_cli.Target) -> None:
    page = rest_cli.call(
        target, "GET", "/admin/policy/history", params={"limit": args.limit}
    ).json()
    for item in page["items"]:
        settings = item["settings"]
        rollback = f" (rollback of {item['rollback_of']})" if item["rollback_of"] else ""
        print(
            f"{item['version']:>5}  {item['created_at']}  {item['status']['state']:<8} "
            f"{settings['policy']['name']:<10} {item['actor']}: {item['reason']}{rollback}"
        )
    print(f"{len(page['items'])} of {page['total']} versions")


def cmd_rollback(args: argparse.Namespace, target: rest_cli.Target) -> None:
    response = rest_cli.call(
        target,
        "POST",
        f"/admin/policy/rollback/{args.version}",
        json={"reason": args.reason},
        headers=_if_match(args),
    )
    _print_result(response.json())


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], func: Callable[..., int]
) -> None:
    """``servedeck policy get|apply|diff|history|rollback``; ``func`` runs the parsed args."""
    command = rest_cli.add_group(
        sub, "policy", "the active policy as code, over the admin API", func
    )
    command("get", "print the active setting as YAML (what apply -f takes)", cmd_get)
    for name, help, handler in (
        ("apply", "apply a policy file (a no-op when it equals what is active)", cmd_apply),
        ("diff", "dry run: show what applying the file would change", cmd_diff),
    ):
        p = command(name, help, handler)
        p.add_argument("-f", "--file", required=True, help="policy YAML file ('-': stdin)")
        p.add_argument("--if-match", type=int, help="refuse unless version N is active")
        p.add_argument("--reason", help="why (default: the file's reason, or its name)")
        if name == "apply":
            p.add_argument("--dry-run", action="store_true", help="validate and diff only")
    p = command("history", "list stored versions, newest first", cmd_history)
    p.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    p = command("rollback", "store a new version copying version N", cmd_rollback)
    p.add_argument("version", type=int)
    p.add_argument("--reason", help='why (default "rollback to version N")')
    p.add_argument("--if-match", type=int, help="refuse unless version N is active")
