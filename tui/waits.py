"""Why a request waits, as the console shows it: each reason's short label and colour class
(one helper, as ``formatting.coloured`` is for thresholds), the figures in words, and the
timeline's phases. The vocabulary is the server's (docs/observability.md); a reason, phase or
figure this console does not know is shown as the server names it, never refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from textual.content import Content

from tui.models import HeldShare, WaitNow

WaitClass = Literal["memory", "batch", "step", "queue", "other"]
"""What kind of constraint: KV memory, the batch's caps, the step's budget, the queue's order."""

REASONS: dict[str, tuple[str, WaitClass]] = {
    "next_step": ("next step", "step"),
    "prompt_budget_spent": ("budget", "step"),
    "grammar_compiling": ("grammar", "step"),
    "kv_blocks_short": ("kv blocks", "memory"),
    "max_num_seqs": ("max seqs", "batch"),
    "draining_cap": ("draining", "batch"),
    "hybrid_single": ("single", "batch"),
    "group_running": ("group runs", "batch"),
    "group_not_chosen": ("not chosen", "batch"),
    "behind_queue": ("behind", "queue"),
}
"""Reason → (short label, class)."""

CLASS_STYLES: dict[WaitClass, str] = {
    "memory": "#e5534b",  # red
    "batch": "#e0a526",  # yellow
    "step": "#39c5cf",  # cyan
    "queue": "#c678dd",  # magenta
    "other": "#8b949e",  # grey
}
"""Colours, not theme variables or ANSI names: the request table's cells are Rich text, the
panels' Textual content, and a reason has the same colour in the table, the waits panel and
the timeline's bar."""

PHASE_STYLES: dict[str, str] = {"prefill": "#4f8ff7", "decode": "#57ab5a"}
"""Blue and green; a phase this console does not know is grey."""

BEHIND = "↳"
"""Marks a request waiting behind the queue's head, before what holds the head."""


def label(reason: str) -> str:
    return REASONS.get(reason, (reason.replace("_", " "), "other"))[0]


def wait_class(reason: str) -> WaitClass:
    return REASONS.get(reason, ("", "other"))[1]


def reason_style(reason: str) -> str:
    return CLASS_STYLES[wait_class(reason)]


def held_reason(wait: WaitNow) -> str:
    """What holds it: its own reason, or, behind the head, the head's (when the server names
    one)."""
    if wait.reason == "behind_queue" and wait.hold is not None:
        return wait.hold.reason
    return wait.reason


def wait_label(wait: WaitNow) -> str:
    """``kv blocks`` (its own reason) or ``↳kv blocks`` (behind a head held for KV blocks)."""
    if wait.reason == "behind_queue" and wait.hold is not None:
        return BEHIND + label(wait.hold.reason)
    return label(wait.reason)


def figures_text(figures: Any) -> str:
    """A hold's figures in words: ``needs 12 blocks, 3 free (reserve 51)``, ``4/4 running``,
    ``0 of 512 prompt tokens left``; figures of another shape as ``key=value``."""
    if not isinstance(figures, Mapping) or not figures:
        return ""
    keys = set(figures)
    if keys == {"needed", "free", "reserve"}:
        needed, free, reserve = figures["needed"], figures["free"], figures["reserve"]
        if needed is None:
            return f"pool dry: {free} free (reserve {reserve})"
        return f"needs {needed} blocks, {free} free (reserve {reserve})"
    if keys == {"running", "cap"}:
        return f"{figures['running']}/{figures['cap']} running"
    if keys == {"left", "budget", "needed"}:
        text = f"{figures['left']} of {figures['budget']} prompt tokens left"
        return text + ("" if figures["needed"] is None else f", needs {figures['needed']}")
    return " ".join(f"{k}={v}" for k, v in figures.items())


def figures_change(first: Any, last: Any) -> str:
    """A wait's figures from its first step to its last: ``needs 32 blocks, 10→30 free
    (reserve 51)``; one of them when the other is missing or they are of other shapes."""
    if not isinstance(first, Mapping) or not isinstance(last, Mapping) or first == last:
        return figures_text(last) or figures_text(first)
    if set(first) != set(last):
        return f"{figures_text(first)} → {figures_text(last)}"
    merged = {
        k: last[k] if first[k] == last[k] else f"{'—' if first[k] is None else first[k]}→{last[k]}"
        for k in last
    }
    return figures_text(merged)


def biggest_first(shares: Iterable[HeldShare]) -> list[HeldShare]:
    """Shares summed by reason (a fleet may repeat one), the biggest first; zeros left out."""
    by: dict[str, float] = {}
    for share in shares:
        by[share.reason] = by.get(share.reason, 0.0) + share.seconds
    return [
        HeldShare(reason=r, seconds=s) for r, s in sorted(by.items(), key=lambda i: -i[1]) if s > 0
    ]


def shares_parts(shares: Iterable[HeldShare]) -> list[tuple[str, str]]:
    """``kv blocks 80% · max seqs 20%`` as (text, style) pieces, each label in its colour, the
    biggest first (pieces, so a table's Rich text and a panel's Content read the same)."""
    ordered = biggest_first(shares)
    total = sum(share.seconds for share in ordered)
    parts: list[tuple[str, str]] = []
    for share in ordered:
        if parts:
            parts.append((" · ", ""))
        parts.append((label(share.reason), reason_style(share.reason)))
        parts.append((f" {share.seconds / total:.0%}", ""))
    return parts


def shares_text(shares: Iterable[HeldShare]) -> Content:
    return Content.assemble(*shares_parts(shares))
