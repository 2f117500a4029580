"""Number formatting and the one threshold colouring helper every panel uses."""

from __future__ import annotations

from typing import Literal

from textual.content import Content

Level = Literal["ok", "warn", "crit", "none"]

LEVEL_STYLES: dict[Level, str] = {
    "ok": "$text-success",
    "warn": "$text-warning",
    "crit": "$text-error",
    "none": "$text-muted",
}


def level(value: float | None, warn: float, crit: float) -> Level:
    """Where ``value`` sits against its thresholds (higher is worse)."""
    if value is None:
        return "none"
    if value >= crit:
        return "crit"
    if value >= warn:
        return "warn"
    return "ok"


def coloured(text: str, value: float | None, warn: float, crit: float) -> Content:
    return Content.styled(text, LEVEL_STYLES[level(value, warn, crit)])


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1.0:
        return f"{value * 1000:.0f} ms"
    if value < 100:
        return f"{value:.2f} s"
    return f"{value:.0f} s"


def duration(value: float) -> str:
    """Uptime-style: ``42s``, ``13m 32s``, ``2h 03m``, ``3d 04h``."""
    total = int(value)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def clock_time(iso: str | None) -> str:
    """``2026-11-29T10:00:05.123Z`` → ``10:00:05`` (the server's UTC time of day)."""
    if not iso:
        return "—"
    _, sep, rest = iso.partition("T")
    return rest[:8] if sep else iso


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def policy_text(name: str, params: dict[str, object], memory_reserve: float | None = None) -> str:
    """``continuous max_num_seqs=128 reserve=0.15``: a policy setting on one line."""
    words = [name, *(f"{k}={v}" for k, v in params.items())]
    if memory_reserve is not None:
        words.append(f"reserve={memory_reserve:g}")
    return " ".join(words)
