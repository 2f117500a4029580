"""What ``servedeck policy|schedule|guardrail ...`` share: the admin API from the command line.

One transport for every admin command group: the target (``--url`` / ``SERVEDECK_URL``, the
token from ``--token`` / ``SERVEDECK_ADMIN_TOKEN``, ``--token-file`` or a local server's saved
one), one request helper that turns a refusal into the server's own message, YAML in and out,
plain tables, and the parser flags every subcommand takes.

Exit status: 0 done; 1 the server refused (its message is printed) or could not be reached;
2 a usage error (bad flags, a missing or unreadable file, no admin token). The token is sent,
never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 30.0
ZERO = timedelta(0)


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


Handler = Callable[[argparse.Namespace, Target], None]


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


def call(target: Target, method: str, path: str, **kwargs: Any) -> httpx.Response:  # httpx's
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


# Any below: a user's YAML file or the server's JSON body, read by key; the server validates
# the fields (the typed wire models are issue 43's "one wire contract", not this room's).
def read_yaml_file(path: str, holds: Iterable[str]) -> dict[str, Any]:
    """The file's mapping (``-``: stdin); the server validates the fields themselves (a 422
    names them). ``holds`` names the keys expected, for the message when it is no mapping."""
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
        raise CliError(2, f"{path} must hold a mapping with {', '.join(holds)}")
    return data


def dump_yaml(data: dict[str, Any]) -> str:
    """Block-style YAML in the mapping's own key order."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def comment(*lines: str) -> str:
    """Lines as YAML comments, so a printed file still loads as the mapping alone."""
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def reason_of(args: argparse.Namespace, body: dict[str, Any], default: str) -> str:
    """``--reason``, else the file's ``reason:``, else ``default`` (the command that ran)."""
    return args.reason or body.get("reason") or default


def file_label(path: str) -> str:
    return "stdin" if path == "-" else Path(path).name


def when(value: str | None) -> str:
    """An ISO time from the API as ``YYYY-MM-DD HH:MM:SS`` (``Z`` when it is UTC)."""
    if value is None:
        return "-"
    moment = datetime.fromisoformat(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + ("Z" if moment.utcoffset() == ZERO else "")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *rows):
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines) + "\n"


def add_group(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    func: Callable[..., int],
) -> Callable[[str, str, Handler], argparse.ArgumentParser]:
    """``servedeck NAME ...``; returns ``command(name, help, handler)`` that adds one
    subcommand with the target flags every admin command takes. ``func`` runs the parsed
    args (it calls ``run``); ``handler`` does the subcommand's work."""
    group = sub.add_parser(name, help=help)
    group_sub = group.add_subparsers(dest="rest_command", required=True)

    def command(command: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        p = group_sub.add_parser(command, help=help)
        p.add_argument("--url", help=f"server URL ($SERVEDECK_URL; default {DEFAULT_URL})")
        p.add_argument("--token", help="admin token ($SERVEDECK_ADMIN_TOKEN)")
        p.add_argument("--token-file", help="file holding it ($SERVEDECK_ADMIN_TOKEN_FILE)")
        p.add_argument("--db", help="local server's SQLite file, to find its saved token")
        p.set_defaults(func=func, rest_func=handler)
        return p

    return command


def run(args: argparse.Namespace, local_token: Callable[[], str | None]) -> int:
    """Run one admin subcommand; errors go to stderr with their exit status."""
    try:
        args.rest_func(args, target_of(args, local_token))
    except CliError as exc:
        print(f"servedeck {args.command} {args.rest_command}: {exc}", file=sys.stderr)
        return exc.status
    return 0
