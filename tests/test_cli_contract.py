"""The CLI's flags are public (issue 43: "nothing public changes"): every command's and
subcommand's flags, read from its own ``--help``, equal the committed ``docs/cli_flags.json``.
A flag added, renamed or dropped on purpose is committed with the file written again::

    SERVEDECK_UPDATE_CLI_FLAGS=1 .venv/bin/python -m pytest tests/test_cli_contract.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest

from control.cli import build_parser

COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "cli_flags.json"
UPDATE = "SERVEDECK_UPDATE_CLI_FLAGS"
FLAG = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")
SUBCOMMANDS = re.compile(r"positional arguments:\n\s+\{([\w,-]+)\}")


def help_text(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def flags(argv: list[str], into: dict[str, list[str]], parent: str = "") -> dict[str, list[str]]:
    """``argv``'s flags and, for each subcommand its help names, theirs (depth first)."""
    text = help_text(argv)
    if text == parent:
        return into  # a positional's choice, not a subcommand: its parent's help again
    _usage, _, rest = text.partition("\n\n")
    into[" ".join(argv) or "servedeck"] = sorted(set(FLAG.findall(rest)))
    if subcommands := SUBCOMMANDS.search(text):
        for name in subcommands.group(1).split(","):
            flags([*argv, name], into, text)
    return into


def test_the_cli_flags_are_the_committed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # argparse wraps its help to the terminal's width, and textwrap may break a flag at a
    # hyphen: one line per option, whatever the terminal.
    monkeypatch.setenv("COLUMNS", "10000")
    served = flags([], {})
    assert "--model" in served["serve"] and "--dtype" in served["serve"]  # read, not empty
    if os.environ.get(UPDATE) == "1":
        COMMITTED.write_text(json.dumps(served, indent=1, sort_keys=True) + "\n")
    committed = json.loads(COMMITTED.read_text())
    differ = {
        command: {
            "added": sorted(set(served.get(command, [])) - set(committed.get(command, []))),
            "gone": sorted(set(committed.get(command, [])) - set(served.get(command, []))),
        }
        for command in sorted(served.keys() | committed.keys())
        if served.get(command) != committed.get(command)
    }
    assert not differ, (
        f"the CLI's flags differ from {COMMITTED.name}: {differ}; if that is meant, write it "
        f"again with {UPDATE}=1 and say so"
    )
