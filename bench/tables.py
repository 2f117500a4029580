"""The report's tables: every column a table may show, named by run key, and how its cells
are formatted. A table lists its columns by key (``columns("policy", "ttft_p50")``), never
by position in another list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.formatting import pct
from bench.metrics import LATENCY_KEYS, THROUGHPUT_KEYS
from bench.ratios import Run


def num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def as_ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def as_pct(value: Any) -> str:
    return "–" if value is None else pct(value)


def rate(value: Any) -> str:
    return "–" if value is None else f"{value:.1f}"


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    """The run's key the cell shows."""
    title: str
    fmt: Callable[[Any], str] = num

    def titled(self, title: str) -> Column:
        return Column(self.key, title, self.fmt)


COLUMNS: dict[str, Column] = {
    c.key: c
    for c in (
        Column("policy", "policy", str),
        Column("output_throughput", "output tok/s", rate),
        Column("total_throughput", "total tok/s", rate),
        Column("ttft_p50", "TTFT p50 ms", as_ms),
        Column("ttft_p99", "TTFT p99 ms", as_ms),
        Column("tpot_p50", "TPOT p50 ms", as_ms),
        Column("e2e_p50", "e2e p50 ms", as_ms),
        Column("kv_utilization", "KV util", as_pct),
        Column("padding_waste", "padding", as_pct),
        Column("preemptions", "preempt"),
        Column("engine_overhead", "overhead", as_pct),
        Column("regathers_per_100_decode_steps", "re-gathers /100 decode steps", rate),
        Column("decode_row_copies", "decode row copies"),
        Column("padding_waste_prefill", "prefill padding", as_pct),
        Column("engine_overhead_batch32", "overhead ≥32", as_pct),
        Column("replay_efficiency", "replay eff."),
        Column("outputs_equal_to_continuous", "same tokens", as_pct),
        Column("mean_batch_size", "mean batch"),
        Column("block_size", "block size"),
        Column("load", "load"),
        Column("rate", "req/s"),
        Column("goodput", "goodput req/s"),
        Column("ttft_p50_short", "short TTFT p50 ms", as_ms),
        Column("ttft_p99_short", "short TTFT p99 ms", as_ms),
        Column("ttft_p50_long", "long TTFT p50 ms", as_ms),
        Column("memory_reserve", "reserve"),
        Column("kv_pool_tokens", "pool slots"),
        Column("refused", "refused"),
        Column("mean_requests_holding_kv", "mean requests holding KV"),
        Column("max_requests_holding_kv", "peak"),
        Column("bookkeeping_bytes", "block-manager bytes"),
        Column("kv_bytes_held_at_peak", "KV bytes held at peak"),
        Column("reclaim_every_s", "sweep every s"),
        Column("leaked", "leaked requests"),
        Column("reclaims", "sweeps"),
        Column("reclaimed_blocks", "blocks reclaimed"),
        Column("reclaim_cpu_share", "sweep time share", as_pct),
        Column("kv_leaked_share", "leaked share of held", as_pct),
        Column("kv_utilization_effective", "effective KV util", as_pct),
    )
}
"""Every column a table may show, by run key; a table names its columns by key."""

CORE = (
    "policy",
    *THROUGHPUT_KEYS,
    *LATENCY_KEYS,
    "kv_utilization",
    "padding_waste",
    "preemptions",
    "engine_overhead",
)
"""The burst tables' columns."""


def columns(*keys: str | Column) -> list[Column]:
    """The registered columns for ``keys``; a ``Column`` passes through (a retitled one)."""
    return [k if isinstance(k, Column) else COLUMNS[k] for k in keys]


def table(runs: Sequence[Run], cols: Sequence[Column]) -> list[str]:
    if not runs:
        return ["_(no runs)_", ""]
    lines = [
        "| " + " | ".join(c.title for c in cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for run in runs:
        lines.append("| " + " | ".join(c.fmt(run.get(c.key)) for c in cols) + " |")
    return [*lines, ""]
