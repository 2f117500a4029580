"""``servedeck guardrail ...``: the SLO guardrail from the command line (policy as code).

``get`` prints the config as the YAML that ``set -f`` takes back, with the status (active or
why not, the correction, the margin, the observed figures) as ``#`` comments; ``mode off`` is
the kill switch: it reads the config, changes only the mode and puts it back, so objectives and
bounds stay as they are; ``decisions`` is a table of what the guardrail proposed and what became
of it, with the predicted and the observed TTFT p99. The transport, the flags and the exit
statuses are control/core/rest_cli.py's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, get_args

from control.core import rest_cli
from control.guardrail.schemas import GuardrailMode
from control.schedules.cli import policy_label

CONFIG_KEYS = ("mode", "objectives", "bounds")
"""The keys a guardrail file is about (``GuardrailConfig``; the others have defaults)."""


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} s"


# Any below: the admin API's JSON bodies, read by key (the typed wire models are issue 43's
# "one wire contract", not this room's).
def observed_line(observed: dict[str, Any] | None) -> str:
    if not observed:
        return "observed: nothing yet"
    return (
        f"observed {rest_cli.when(observed['since'])} .. {rest_cli.when(observed['until'])}: "
        f"{observed['requests']} requests, {observed['output_tokens_per_s']:.1f} output tok/s, "
        f"TTFT p99 {seconds(observed['ttft_p99_s'])}, TPOT p99 {seconds(observed['tpot_p99_s'])}"
        + (f", goodput {observed['goodput_rps']:.3g} req/s" if observed.get("goodput_rps") else "")
    )


def status_lines(view: dict[str, Any]) -> list[str]:
    status = view["status"]
    stored = (
        f"revision {view['revision']} by {view['actor']} at {rest_cli.when(view['updated_at'])}: "
        f"{view['reason']}"
        if view["revision"]
        else "revision 0 (the defaults, never stored)"
    )
    note = status.get("reason")  # the server's words: why not active, or what it last saw
    state = note or "not active"
    if status["active"]:
        state = f"active; {note}" if note else "active"
    correction, margin = status.get("correction"), status.get("margin")
    lines = [
        f"servedeck guardrail {stored}",
        f"status: {state}",
        f"cost model: {status.get('cost_model') or '-'}; correction "
        f"{'-' if correction is None else f'{correction:.3g}'}; margin "
        f"{'-' if margin is None else f'{margin:+.3g}'}",
        observed_line(status.get("observed")),
        f"last evaluation {rest_cli.when(status.get('last_evaluation_at'))}; "
        f"last change {rest_cli.when(status.get('last_change_at'))}",
    ]
    if status.get("window_active") is not None:
        lines.append(f"schedule {status['window_active']}'s window is in force (it wins)")
    return lines


def guardrail_yaml(view: dict[str, Any]) -> str:
    """The config as a guardrail file, the status above it as comments."""
    return rest_cli.comment(*status_lines(view)) + rest_cli.dump_yaml(view["config"])


def change_label(current: dict[str, Any], chosen: dict[str, Any]) -> str:
    """What a decision changes: ``max_num_batched_tokens 256 -> 1024; memory_reserve ...``."""
    before, after = current["policy"], chosen["policy"]
    changes = []
    if before["name"] != after["name"]:
        changes.append(f"{policy_label(current)} -> {policy_label(chosen)}")
    else:
        old, new = before.get("params") or {}, after.get("params") or {}
        changes += [
            f"{key} {old.get(key, 'default')} -> {new.get(key, 'default')}"
            for key in dict.fromkeys([*old, *new])
            if old.get(key) != new.get(key)
        ]
        if current.get("memory_reserve") != chosen.get("memory_reserve"):
            changes.append(
                f"memory_reserve {current['memory_reserve']} -> {chosen['memory_reserve']}"
            )
    if current.get("reclaim_interval_s") != chosen.get("reclaim_interval_s"):
        changes.append(
            f"reclaim_interval_s {current['reclaim_interval_s']} -> {chosen['reclaim_interval_s']}"
        )
    return "; ".join(changes) or "(none)"


ERROR_NOTE = (
    "observed: TTFT p99 over the interval after the decision; error: observed / predicted "
    "for the setting in force then (the chosen one if applied, else the one now)"
)


def decision_row(item: dict[str, Any]) -> tuple[str, ...]:
    error = (item.get("prediction_error") or {}).get("ttft_p99_s")
    observed = (item.get("observed_after") or {}).get("ttft_p99_s")
    return (
        str(item["id"]),
        rest_cli.when(item["at"]),
        item["outcome"],
        change_label(item["current"], item["chosen"]),
        f"{seconds(item['predicted_current']['ttft_p99_s'])} -> "
        f"{seconds(item['predicted']['ttft_p99_s'])}",
        seconds(observed),
        "-" if error is None else f"x{error:.2f}",
    )


def _print_view(view: dict[str, Any], before: str | None = None) -> None:
    mode = view["config"]["mode"]
    change = f"{before} -> {mode}" if before is not None and before != mode else mode
    print(f"stored revision {view['revision']}: mode {change}")
    print(rest_cli.comment(*status_lines(view)[1:2]), end="")


def cmd_get(args: argparse.Namespace, target: rest_cli.Target) -> None:
    print(guardrail_yaml(rest_cli.call(target, "GET", "/admin/guardrail").json()), end="")


def cmd_set(args: argparse.Namespace, target: rest_cli.Target) -> None:
    body = rest_cli.read_yaml_file(args.file, CONFIG_KEYS)
    body["reason"] = rest_cli.reason_of(
        args, body, f"servedeck guardrail set -f {rest_cli.file_label(args.file)}"
    )
    _print_view(rest_cli.call(target, "PUT", "/admin/guardrail", json=body).json())


def cmd_mode(args: argparse.Namespace, target: rest_cli.Target) -> None:
    """Reads the config and puts it back with only the mode changed (and the reason)."""
    response = rest_cli.call(target, "GET", "/admin/guardrail")
    config = response.json()["config"]
    before = config["mode"]
    etag = response.headers.get("etag")
    view = rest_cli.call(
        target,
        "PUT",
        "/admin/guardrail",
        json={**config, "mode": args.mode, "reason": args.reason},
        headers={"If-Match": etag} if etag else {},
    ).json()
    _print_view(view, before)


def cmd_decisions(args: argparse.Namespace, target: rest_cli.Target) -> None:
    page = rest_cli.call(
        target, "GET", "/admin/guardrail/decisions", params={"limit": args.limit}
    ).json()
    items = page["items"]
    header = (
        "ID",
        "AT",
        "OUTCOME",
        "CHANGE",
        "TTFT P99 PREDICTED NOW -> CHOSEN",
        "OBSERVED",
        "ERROR",
    )
    print(rest_cli.table(header, [decision_row(item) for item in items]), end="")
    if args.verbose:
        for item in items:
            print(f"{item['id']}: {item['reason']}")
    print(f"{len(items)} decisions; {ERROR_NOTE}")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], func: Callable[..., int]
) -> None:
    """``servedeck guardrail get|set|mode|decisions``; ``func`` runs the parsed args."""
    command = rest_cli.add_group(sub, "guardrail", "the SLO guardrail, over the admin API", func)
    command("get", "print the config as YAML (what set -f takes), the status as comments", cmd_get)
    p = command("set", "store a guardrail config from a YAML file", cmd_set)
    p.add_argument("-f", "--file", required=True, help="guardrail YAML file ('-': stdin)")
    p.add_argument("--reason", help="why (default: the file's reason, or its name)")
    p = command("mode", "change only the mode (off: the kill switch)", cmd_mode)
    p.add_argument("mode", choices=get_args(GuardrailMode))
    p.add_argument("--reason", required=True, help="why (required)")
    p = command("decisions", "a table of its decisions, newest first", cmd_decisions)
    p.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print each reason")
