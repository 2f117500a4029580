"""PNG plots drawn from a results document alone, so a saved results.json can be re-plotted:
``python -m bench.plots bench/results/cpu/results.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.ratios import Run, find_all

COLORS = {
    "static": "#8c564b",
    "dynamic": "#d62728",
    "continuous": "#1f77b4",
    "hybrid": "#2ca02c",
    "hf-static": "#7f7f7f",
    "hf-continuous": "#bcbd22",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def throughput_vs_concurrency(doc: dict[str, Any], out: Path) -> Path | None:
    runs: list[Run] = doc["runs"]
    sweep = find_all(runs, suite="batch-sweep")
    bursts = find_all(runs, suite="burst")
    if not sweep and not bursts:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, rows, title in (
        (axes[0], sweep, "closed loop: B clients, max batch B"),
        (axes[1], bursts, "bursts: N requests at t=0"),
    ):
        for workload, style in (("burst-fixed", "-o"), ("burst-variable", "--s")):
            for policy in COLORS:
                points = sorted(
                    (r["concurrency"], r["output_throughput"])
                    for r in rows
                    if r["policy"] == policy and r["workload"] == workload
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    label = policy if rows is sweep else f"{policy} ({workload.split('-')[1]})"
                    ax.plot(xs, ys, style, color=COLORS[policy], label=label)
        ax.set_xscale("log", base=2)
        sizes = sorted({r["concurrency"] for r in rows})
        if sizes:
            ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out / "throughput_vs_concurrency.png")


def ttft_cdf(doc: dict[str, Any], out: Path) -> Path | None:
    runs: list[Run] = doc["runs"]
    series = doc["series"]
    base = doc["settings"]["concurrencies"][0]
    panels = [
        (f"{w}, {base} concurrent", find_all(runs, suite="burst", workload=w, concurrency=base))
        for w in ("burst-fixed", "burst-variable")
    ]
    panels.append(("issue 2's mixed workload (with peers)", find_all(runs, workload="mixed")))
    panels = [(t, rows) for t, rows in panels if any(series.get(r["id"]) for r in rows)]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels, strict=True):
        for run in rows:
            values = (series.get(run["id"]) or {}).get("ttft") or []
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(
                    values, ys, where="post", color=COLORS.get(run["policy"]), label=run["policy"]
                )
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("share of requests")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out / "ttft_cdf.png")


def kv_over_time(doc: dict[str, Any], out: Path) -> Path | None:
    base = doc["settings"]["concurrencies"][0]
    rows = find_all(doc["runs"], suite="burst", workload="burst-fixed", concurrency=base)
    rows = [r for r in rows if (doc["series"].get(r["id"]) or {}).get("t")]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for run in rows:
        s = doc["series"][run["id"]]
        label = f"{run['policy']} (mean {run['kv_utilization']:.0%})"
        ax.plot(s["t"], s["kv_utilization"], color=COLORS.get(run["policy"]), label=label, lw=1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("time since the burst (s)")
    ax.set_ylabel("tokens stored / slots held")
    ax.set_title(f"KV utilization per step, burst-fixed, {base} concurrent", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out / "kv_utilization.png")


def batch_tradeoff(doc: dict[str, Any], out: Path) -> Path | None:
    sweep = find_all(doc["runs"], suite="batch-sweep")
    if not sweep:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in COLORS:
        points = sorted(
            (r["concurrency"], r["ttft_p50"], r["output_throughput"])
            for r in sweep
            if r["policy"] == policy and r["ttft_p50"] is not None
        )
        if not points:
            continue
        _, ttft, tput = zip(*points, strict=True)
        ax.plot(ttft, tput, "-o", color=COLORS[policy], label=policy)
        for b, x, y in points:
            ax.annotate(f"B={b}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT p50 (s)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Batch-size trade-off: throughput against time to first token", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out / "batch_tradeoff.png")


def latency_vs_load(doc: dict[str, Any], out: Path) -> Path | None:
    rows = find_all(doc["runs"], suite="poisson")
    if not rows:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for policy in COLORS:
        points = sorted(
            (r["load"], r["ttft_p99"], r["tpot_p50"]) for r in rows if r["policy"] == policy
        )
        if points:
            loads, ttft, tpot = zip(*points, strict=True)
            axes[0].plot(loads, ttft, "-o", color=COLORS[policy], label=policy)
            axes[1].plot(loads, tpot, "-o", color=COLORS[policy], label=policy)
    for ax, what in ((axes[0], "TTFT p99 (s)"), (axes[1], "TPOT p50 (s)")):
        ax.set_xlabel("arrival rate / continuous saturation rate")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out / "latency_vs_load.png")


PLOTS = (throughput_vs_concurrency, ttft_cdf, kv_over_time, batch_tradeoff, latency_vs_load)


def write_plots(doc: dict[str, Any], out: Path) -> list[Path]:
    try:
        _pyplot()
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'servedeck[bench]')",
              file=sys.stderr)  # fmt: skip
        return []
    return [p for plot in PLOTS if (p := plot(doc, out)) is not None]


if __name__ == "__main__":
    source = Path(sys.argv[1])
    for path in write_plots(json.loads(source.read_text()), source.parent):
        print(path)
