"""Issue 7's targets for a cpu run, checked from the measured runs, and the end-to-end
latency trade-off the report must state where continuous batching makes completions later."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.formatting import fixed3, pct, times
from bench.ratios import Run, divide, find


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    figure: str
    goal: str
    met: bool | None


def at_least(goal: float) -> Callable[[float], bool]:
    return lambda value: value >= goal


def at_most(goal: float) -> Callable[[float], bool]:
    return lambda value: value <= goal


def targets(runs: list[Run], base: int) -> list[Target]:
    """Issue 7's targets for one cpu run (same checks on any preset; they are meant for cpu)."""
    out: list[Target] = []

    def add(name: str, value: float | None, goal: str, ok: Callable[[float], bool], fmt=times):
        out.append(Target(name, fmt(value), goal, None if value is None else ok(value)))

    def burst(policy: str, workload: str) -> Run | None:
        return find(runs, suite="burst", policy=policy, workload=workload, concurrency=base)

    cont_fixed = burst("continuous", "burst-fixed")
    mixed = find(runs, suite="mixed", policy="continuous")
    for label, run in ((f"burst-fixed@{base}", cont_fixed), ("mixed", mixed)):
        if run is not None:
            add(f"engine overhead at batch ≥ 32, {label}", run.get("engine_overhead_batch32"),
                "≤ 3 %", lambda v: v <= 0.03, pct)  # fmt: skip
        if run is not None and run.get("replay_efficiency") is not None:
            add(f"efficiency against the replay bound, {label}", run.get("replay_efficiency"),
                "≥ 0.95", lambda v: v >= 0.95, fixed3)  # fmt: skip
    sweep32 = find(runs, suite="batch-sweep", policy="continuous", concurrency=32)
    if sweep32 is not None:
        add("engine overhead, batch-size sweep at batch 32 (issue 2)",
            sweep32.get("engine_overhead"), "≤ 3 %", lambda v: v <= 0.03, pct)  # fmt: skip
    for peer, goal in (("hf-static", 2.0), ("hf-continuous", 4.0)):
        other = find(runs, suite="peers", policy=peer)
        value = (
            divide(mixed["output_throughput"], other["output_throughput"])
            if mixed and other
            else None
        )
        add(f"continuous / {peer}, output tok/s, mixed", value, f"≥ {goal}×",
            at_least(goal))  # fmt: skip
    for workload, speed, ttft in (("burst-variable", 1.8, 0.4), ("burst-fixed", 1.15, 0.55)):
        c, d = burst("continuous", workload), burst("dynamic", workload)
        value = divide(c["output_throughput"], d["output_throughput"]) if c and d else None
        add(f"continuous / dynamic output tok/s, {workload}@{base}", value, f"≥ {speed}×",
            at_least(speed))  # fmt: skip
        value = divide(c["ttft_p99"], d["ttft_p99"]) if c and d else None
        add(f"continuous / dynamic TTFT p99, {workload}@{base}", value, f"≤ {ttft}×",
            at_most(ttft))  # fmt: skip
    dyn_fixed = burst("dynamic", "burst-fixed")
    add(f"continuous KV utilization, burst-fixed@{base}",
        cont_fixed.get("kv_utilization") if cont_fixed else None, "≥ 0.96",
        lambda v: v >= 0.96, pct)  # fmt: skip
    if cont_fixed and dyn_fixed:
        gap = cont_fixed["kv_utilization"] - dyn_fixed["kv_utilization"]
        add("dynamic's KV utilization shows its padding (points below continuous)", gap,
            "> 0", lambda v: v > 0, pct)  # fmt: skip
    return out


def e2e_tradeoff(runs: list[Run], base: int) -> str | None:
    """The honest trade-off: does continuous make the median completion later?"""
    lines = []
    for workload in ("burst-fixed", "burst-variable"):
        c = find(runs, suite="burst", policy="continuous", workload=workload, concurrency=base)
        d = find(runs, suite="burst", policy="dynamic", workload=workload, concurrency=base)
        if not c or not d or c["e2e_p50"] is None or d["e2e_p50"] is None:
            continue
        later = c["e2e_p50"] > d["e2e_p50"]
        lines.append(
            f"{workload}@{base}: end-to-end p50 {c['e2e_p50']:.2f} s continuous vs "
            f"{d['e2e_p50']:.2f} s dynamic — continuous makes the median completion "
            f"{'LATER' if later else 'earlier'}."
        )
    return "\n".join(lines) or None
