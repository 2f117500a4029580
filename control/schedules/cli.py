"""``servedeck schedule ...``: policy windows from the command line (policy as code).

``get ID`` prints a schedule as the YAML that ``create -f`` takes back (its id, state and next
windows as ``#`` comments), so a window kept in git is created from a pipeline; ``list`` is a
table of them all; ``delete ID --reason R`` removes one (the server keeps its audit). A schedule
is never edited in place: delete it and create the new one. The transport, the flags and the
exit statuses are control/core/rest_cli.py's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from control.core import rest_cli

SCHEDULE_KEYS = (
    "cron",
    "cron_seconds",
    "until",
    "timezone",
    "policy",
    "memory_reserve",
    "reason",
    "priority",
)
"""What a schedule file holds (``ScheduleCreate``'s fields)."""


# The schedules as the admin API sends them: JSON read by key (the console's and the CLI's
# typed copy of the wire models is issue 43's "one wire contract", not this room's).
def policy_label(schedule: dict[str, Any]) -> str:
    """``dynamic(length_window=64) reserve=0.2``: the setting a window applies, on one line."""
    spec = schedule["policy"]
    params = ",".join(f"{k}={v}" for k, v in (spec.get("params") or {}).items())
    label = f"{spec['name']}({params})" if params else spec["name"]
    reserve = schedule.get("memory_reserve")
    return label if reserve is None else f"{label} reserve={reserve}"


def cron_label(schedule: dict[str, Any]) -> str:
    seconds = f" sec={schedule['cron_seconds']}" if schedule.get("cron_seconds") else ""
    return f"{schedule['cron']}{seconds} ({schedule['timezone']})"


def schedule_yaml(detail: dict[str, Any]) -> str:
    """A schedule as a schedule file: who made it, its state and next windows as comments."""
    state = "in force now" if detail["active"] else "not in force"
    lines = [
        f"servedeck schedule {detail['id']} ({state}), by {detail['actor']} "
        f"at {rest_cli.when(detail['created_at'])}",
    ]
    if detail.get("last_end"):
        lines.append(f"last end {rest_cli.when(detail['last_end_at'])}: {detail['last_end']}")
    starts, ends = detail.get("next_firings") or [], detail.get("next_ends") or []
    lines.append("next windows (UTC):" if starts else "no next window")
    lines += [
        f"  {rest_cli.when(start)} -> {rest_cli.when(end)}"
        for start, end in zip(starts, ends, strict=False)
    ]
    return rest_cli.comment(*lines) + rest_cli.dump_yaml(
        {key: detail[key] for key in SCHEDULE_KEYS}
    )


def cmd_list(args: argparse.Namespace, target: rest_cli.Target) -> None:
    page = rest_cli.call(target, "GET", "/admin/schedules").json()
    rows = [
        (
            str(item["id"]),
            cron_label(item),
            item["until"],
            policy_label(item),
            str(item["priority"]),
            rest_cli.when(item["next_run_at"]),
            "yes" if item["active"] else "",
        )
        for item in page["items"]
    ]
    header = ("ID", "CRON (TZ)", "UNTIL", "POLICY", "PRIORITY", "NEXT RUN", "ACTIVE")
    print(rest_cli.table(header, rows), end="")
    active = page["active"]
    in_force = f"schedule {active}'s window is in force" if active else "no window in force"
    print(f"{len(rows)} schedules; {in_force}")


def cmd_get(args: argparse.Namespace, target: rest_cli.Target) -> None:
    print(schedule_yaml(rest_cli.call(target, "GET", f"/admin/schedules/{args.id}").json()), end="")


def cmd_create(args: argparse.Namespace, target: rest_cli.Target) -> None:
    body = rest_cli.read_yaml_file(args.file, ("cron", "until", "policy", "reason"))
    if isinstance(body.get("until"), int):  # YAML 1.1 reads a bare 15:00 as 54000 (base 60)
        raise rest_cli.CliError(
            2,
            f'{args.file}: quote until, e.g. until: "15:00" (YAML reads a bare HH:MM as a number)',
        )
    body["reason"] = rest_cli.reason_of(
        args, body, f"servedeck schedule create -f {rest_cli.file_label(args.file)}"
    )
    made = rest_cli.call(target, "POST", "/admin/schedules", json=body).json()
    print(
        f"created schedule {made['id']}: {policy_label(made)} from {cron_label(made)} "
        f"until {made['until']}; next run {rest_cli.when(made['next_run_at'])}"
    )


def cmd_delete(args: argparse.Namespace, target: rest_cli.Target) -> None:
    gone = rest_cli.call(
        target, "DELETE", f"/admin/schedules/{args.id}", params={"reason": args.reason}
    ).json()
    ends = " (its window in force ends at the next tick)" if gone["active"] else ""
    print(f"deleted schedule {gone['id']}: {policy_label(gone)} from {cron_label(gone)}{ends}")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], func: Callable[..., int]
) -> None:
    """``servedeck schedule list|get|create|delete``; ``func`` runs the parsed args."""
    command = rest_cli.add_group(
        sub, "schedule", "policy windows (cron schedules), over the admin API", func
    )
    command("list", "a table of the schedules and which window is in force", cmd_list)
    p = command(
        "get", "print a schedule as YAML (what create -f takes) and its next windows", cmd_get
    )
    p.add_argument("id", type=int)
    p = command("create", "create a schedule from a YAML file", cmd_create)
    p.add_argument("-f", "--file", required=True, help="schedule YAML file ('-': stdin)")
    p.add_argument("--reason", help="why (default: the file's reason, or its name)")
    p = command("delete", "delete a schedule (its audit is kept)", cmd_delete)
    p.add_argument("id", type=int)
    p.add_argument("--reason", required=True, help="why (required)")
