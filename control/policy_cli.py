"""``servedeck policy ...``: the admin policy API from the command line (policy as code).

An operator keeps the setting in a YAML file in git and applies it from a pipeline. ``get``
prints the active setting as the YAML that ``apply -f`` takes back; the server decides equality
on the effective settings, so applying a file equal to what is active stores nothing and a
changed file makes exactly one version. A version number kept in a file would always be stale,
so ``--if-match N`` is a flag, never part of the file.

Exit status: 0 done; 1 the server refused (its message is printed) or could not be reached;
2 a usage error (bad flags, a missing or unreadable file, no admin token). The token is sent,
never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30.0
SETTINGS_KEYS = ("policy", "memory_reserve", "reclaim_interval_s")
"""What a policy file holds (``PolicySettings``); ``reason`` may be given too."""


class CliError(Exception):
    """A failure with its exit status: 1 refused by the server, 2 usage."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    token: str = ""

    def __repr__(self) -> str:  # never show the token, not even in a traceback
        return f"Target(url={self.url!r})"


def target_of(args: argparse.Namespace, local_token: Callable[[], str | None]) -> Target:
    """``--url`` / ``SERVEDECK_URL``; the token from ``--token`` / ``SERVEDECK_ADMIN_TOKEN``,
    else ``--token-file`` / ``SERVEDECK_ADMIN_TOKEN_FILE``, else a local server's saved one."""
    url = args.url or os.environ.get("SERVEDECK_URL") or DEFAULT_URL
    token = args.token or os.environ.get("SERVEDECK_ADMIN_TOKEN")
    token_file = args.token_file or os.environ.get("SERVEDECK_ADMIN_TOKEN_FILE")
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise CliError(2, f"cannot read the token file {token_file}: {exc.strerror}") from None
    token = token or local_token()
    if not token:
        raise CliError(2, "no admin token: give --token, --token-file or $SERVEDECK_ADMIN_TOKEN")
    return Target(url=url.rstrip("/"), token=token)


def call(target: Target, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One admin request; a refusal raises ``CliError(1)`` with the server's message."""
    import httpx  # lazily: ``servedeck --help`` and the other commands never pay for it

    headers = {"Authorization": f"Bearer {target.token}", **kwargs.pop("headers", {})}
    try:
        response = httpx.request(
            method, target.url + path, headers=headers, timeout=TIMEOUT_S, **kwargs
        )
    except httpx.HTTPError as exc:
        raise CliError(1, f"cannot reach {target.url}: {type(exc).__name__}: {exc}") from None
    if response.is_success:
        return response
    raise CliError(1, f"refused ({response.status_code}): {_message(response)}")


def _message(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text.strip() or response.reason_phrase
    if isinstance(detail, list):  # 422: every failing field
        return "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in detail
        )
    return str(detail)


def settings_yaml(view: dict[str, Any]) -> str:
    """The active setting as a policy file: a comment saying which version, then the
    settings themselves (stored params only, so defaults keep following the server)."""
    import yaml

    status = view.get("status") or {}
    head = (
        f"# servedeck policy version {view['version']} ({status.get('state', '?')}), "
        f"by {view['actor']}: {view['reason']}\n"
    )
    settings = {key: view["settings"][key] for key in SETTINGS_KEYS}
    return head + yaml.safe_dump(settings, sort_keys=False, default_flow_style=False)


def read_policy_file(path: str) -> dict[str, Any]:
    """The file's mapping; the server validates the fields themselves (422 names them)."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(2, f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(2, f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CliError(2, f"{path} must hold a mapping with {', '.join(SETTINGS_KEYS)}")
    return data


def _format_value(value: Any) -> str:
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


def cmd_get(args: argparse.Namespace, target: Target) -> None:
    print(settings_yaml(call(target, "GET", "/admin/policy").json()), end="")


def cmd_apply(args: argparse.Namespace, target: Target, dry_run: bool | None = None) -> None:
    body = read_policy_file(args.file)
    name = "stdin" if args.file == "-" else Path(args.file).name
    body["reason"] = args.reason or body.get("reason") or f"servedeck policy apply -f {name}"
    dry = args.dry_run if dry_run is None else dry_run
    response = call(
        target,
        "PUT",
        "/admin/policy",
        json=body,
        params={"dry_run": "true"} if dry else None,
        headers=_if_match(args),
    )
    _print_result(response.json())


def cmd_diff(args: argparse.Namespace, target: Target) -> None:
    cmd_apply(args, target, dry_run=True)


def cmd_history(args: argparse.Namespace, target: Target) -> None:
    page = call(target, "GET", "/admin/policy/history", params={"limit": args.limit}).json()
    for item in page["items"]:
        settings = item["settings"]
        rollback = f" (rollback of {item['rollback_of']})" if item["rollback_of"] else ""
        print(
            f"{item['version']:>5}  {item['created_at']}  {item['status']['state']:<8} "
            f"{settings['policy']['name']:<10} {item['actor']}: {item['reason']}{rollback}"
        )
    print(f"{len(page['items'])} of {page['total']} versions")


def cmd_rollback(args: argparse.Namespace, target: Target) -> None:
    response = call(
        target,
        "POST",
        f"/admin/policy/rollback/{args.version}",
        json={"reason": args.reason},
        headers=_if_match(args),
    )
    _print_result(response.json())


def run(args: argparse.Namespace, local_token: Callable[[], str | None]) -> int:
    """Run one ``servedeck policy`` subcommand; errors go to stderr with their exit status."""
    try:
        args.policy_func(args, target_of(args, local_token))
    except CliError as exc:
        print(f"servedeck policy {args.policy_command}: {exc}", file=sys.stderr)
        return exc.status
    return 0


def add_parser(sub: argparse._SubParsersAction, func: Callable[..., int]) -> None:
    """``servedeck policy get|apply|diff|history|rollback``; ``func`` runs the parsed args."""
    policy = sub.add_parser("policy", help="the active policy as code, over the admin API")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)

    def command(name: str, help: str, handler: Callable[..., None]) -> argparse.ArgumentParser:
        p = policy_sub.add_parser(name, help=help)
        p.add_argument("--url", help=f"server URL ($SERVEDECK_URL; default {DEFAULT_URL})")
        p.add_argument("--token", help="admin token ($SERVEDECK_ADMIN_TOKEN)")
        p.add_argument("--token-file", help="file holding it ($SERVEDECK_ADMIN_TOKEN_FILE)")
        p.add_argument("--db", help="local server's SQLite file, to find its saved token")
        p.set_defaults(func=func, policy_func=handler)
        return p

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
