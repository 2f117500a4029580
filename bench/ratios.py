"""Ratios between policies (and peers) that ran the same request list in this process run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bench.metrics import LATENCY_KEYS, THROUGHPUT_KEYS

RATIO_SUITES = ("burst", "mixed", "peers", "short-long")
RATIO_METRICS = (*THROUGHPUT_KEYS, *LATENCY_KEYS, "kv_utilization")
REFERENCE = "continuous"
Run = dict[str, Any]


def find(runs: Iterable[Run], **where: Any) -> Run | None:
    """The first run whose fields equal every ``where`` item."""
    for run in runs:
        if all(run.get(k) == v for k, v in where.items()):
            return run
    return None


def find_all(runs: Iterable[Run], **where: Any) -> list[Run]:
    return [run for run in runs if all(run.get(k) == v for k, v in where.items())]


def divide(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return a / b


def group_key(run: Run) -> str:
    return f"{run['workload']}@{run['concurrency']}"


def compute_ratios(runs: list[Run]) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{"burst-fixed@100": {"continuous/dynamic": {"output_throughput": 2.1, ...}}}``:
    continuous over every other policy or peer on the same workload and concurrency."""
    groups: dict[str, dict[str, Run]] = {}
    for run in runs:
        if run["suite"] in RATIO_SUITES:
            groups.setdefault(group_key(run), {}).setdefault(run["policy"], run)
    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    for key, by_policy in groups.items():
        reference = by_policy.get(REFERENCE)
        if reference is None:
            continue
        for policy, other in by_policy.items():
            if policy == REFERENCE:
                continue
            ratios.setdefault(key, {})[f"{REFERENCE}/{policy}"] = {
                m: divide(reference.get(m), other.get(m)) for m in RATIO_METRICS
            }
    return ratios
