"""How verdicts and targets print their figures."""

from __future__ import annotations


def pct(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3%}" if 0 < abs(x) < 0.001 else f"{x:.1%}"


def times(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}×"


def fixed3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms"
