"""results.json and report.md (the article-style tables, ratios, targets and claims)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.claims import judge
from bench.formatting import pct
from bench.presets import Preset
from bench.ratios import Run, compute_ratios, find_all
from bench.suite import BenchOutput
from bench.targets import e2e_tradeoff, targets

SCHEMA_VERSION = 1
REQUIRED_RUN_KEYS = (
    "policy",
    "workload",
    "concurrency",
    "output_throughput",
    "total_throughput",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "kv_utilization",
    "padding_waste",
    "preemptions",
    "engine_overhead",
)


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def results_document(
    preset: Preset, machine: dict[str, Any], output: BenchOutput, command: str
) -> dict:
    base = preset.base_concurrency
    large = preset.concurrencies[1] if len(preset.concurrencies) > 1 else None
    return _clean(
        {
            "schema_version": SCHEMA_VERSION,
            "preset": preset.name,
            "command": command,
            "machine": machine,
            "settings": {
                "scale": preset.scale,
                "concurrencies": list(preset.concurrencies),
                "kv_pool_tokens": preset.kv_tokens,
                "slo": asdict(preset.slo),
                "length_window": preset.scaled_window,
                "mixed_scale": preset.mixed_scale,
                "saturation_rate": output.saturation_rate,
            },
            "runs": output.runs,
            "ratios": compute_ratios(output.runs),
            "targets": [asdict(t) for t in targets(output.runs, base)],
            "claims": judge(output.runs, base, large),
            "skipped": output.skipped,
            "interrupted": output.interrupted,
            "series": output.series,
        }
    )


# -- markdown ---------------------------------------------------------------------------


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def _pct(value: Any) -> str:
    return "–" if value is None else pct(value)


def _rate(value: Any) -> str:
    return "–" if value is None else f"{value:.1f}"


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    """The run's key the cell shows."""
    title: str
    fmt: Callable[[Any], str] = _num

    def titled(self, title: str) -> Column:
        return Column(self.key, title, self.fmt)


COLUMNS: dict[str, Column] = {
    c.key: c
    for c in (
        Column("policy", "policy", str),
        Column("output_throughput", "output tok/s", _rate),
        Column("total_throughput", "total tok/s", _rate),
        Column("ttft_p50", "TTFT p50 ms", _ms),
        Column("ttft_p99", "TTFT p99 ms", _ms),
        Column("tpot_p50", "TPOT p50 ms", _ms),
        Column("e2e_p50", "e2e p50 ms", _ms),
        Column("kv_utilization", "KV util", _pct),
        Column("padding_waste", "padding", _pct),
        Column("preemptions", "preempt"),
        Column("engine_overhead", "overhead", _pct),
        Column("padding_waste_prefill", "prefill padding", _pct),
        Column("engine_overhead_batch32", "overhead ≥32", _pct),
        Column("replay_efficiency", "replay eff."),
        Column("outputs_equal_to_continuous", "same tokens", _pct),
        Column("mean_batch_size", "mean batch"),
        Column("block_size", "block size"),
        Column("load", "load"),
        Column("rate", "req/s"),
        Column("goodput", "goodput req/s"),
        Column("ttft_p50_short", "short TTFT p50 ms", _ms),
        Column("ttft_p99_short", "short TTFT p99 ms", _ms),
        Column("ttft_p50_long", "long TTFT p50 ms", _ms),
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
        Column("reclaim_cpu_share", "sweep time share", _pct),
        Column("kv_leaked_share", "leaked share of held", _pct),
        Column("kv_utilization_effective", "effective KV util", _pct),
    )
}
"""Every column a table may show, by run key; a table names its columns by key."""

CORE = (
    "policy",
    "output_throughput",
    "total_throughput",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "e2e_p50",
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


def render_markdown(
    doc: dict[str, Any], command: str, plots: Sequence[str] = (), notes: str = ""
) -> str:
    """The report; ``notes`` (a reader's analysis of this run) follow the introduction, the
    article's claims come last, as the table the run is judged by."""
    runs: list[Run] = doc["runs"]
    settings = doc["settings"]
    base = settings["concurrencies"][0]
    machine = doc["machine"]
    out: list[str] = [
        f"# servedeck bench — preset `{doc['preset']}`",
        "",
        f"Made by `{command}` on {machine.get('cpu_count')} × {machine.get('cpu_model')}, "
        f"{machine.get('torch_threads')} torch threads, device {machine.get('device')}, "
        f"torch {machine.get('torch')}, transformers {machine.get('transformers') or 'absent'}; "
        f"wall time {machine.get('bench_wall_s')} s.",
        "",
        f"Machine load average {machine.get('load_average_start')} at start and "
        f"{machine.get('load_average_end')} at the end; a {machine.get('matmul_gflops_start')} → "
        f"{machine.get('matmul_gflops_end')} GFLOP/s matmul probe. Absolute times hold only for "
        "this machine (and are noisy when the load exceeds its cores); the ratios between "
        "policies come from runs of the same process on the same request lists.",
        "",
        f"Lengths are the article's divided by {settings['scale']:g}; KV pool "
        f"{settings['kv_pool_tokens']} token slots for every burst run; dynamic/hybrid length "
        f"window {settings['length_window']} tokens; SLOs for goodput: TTFT ≤ "
        f"{settings['slo']['ttft_s']} s and TPOT ≤ {settings['slo']['tpot_s']} s.",
        "",
    ]
    if doc.get("interrupted"):
        out += ["**This run was interrupted: only the runs below were measured.**", ""]
    if notes:
        out += [notes.strip(), ""]
    out += ["## Policies × concurrency (bursts: every request at t=0)", ""]
    for workload in ("burst-fixed", "burst-variable"):
        for n in settings["concurrencies"]:
            group = find_all(runs, suite="burst", workload=workload, concurrency=n)
            if group:
                out += [f"### {workload}, {n} concurrent", "", *table(group, columns(*CORE))]
    tradeoff = e2e_tradeoff(runs, base)
    if tradeoff:
        out += ["**End-to-end latency, the honest trade-off.**", "", tradeoff, ""]
    out += _ratios_section(doc["ratios"])
    out += _mixed_section(runs, settings.get("mixed_scale", 1))
    out += _sweep_section(runs)
    out += _block_section(runs, base)
    out += _poisson_section(runs, settings.get("saturation_rate"))
    out += _short_long_section(runs)
    out += _maintenance_section(runs)
    out += _targets_section(doc["targets"])
    out += _definitions()
    if doc["skipped"]:
        out += ["## Skipped", "", *[f"- {s}" for s in doc["skipped"]], ""]
    out += plots
    out += _claims_section(doc["claims"], command)
    return "\n".join(out)


def _ratios_section(ratios: dict[str, Any]) -> list[str]:
    out = ["## Ratios: continuous over each other policy (same requests, same process)", ""]
    out += [
        "| workload | vs | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | e2e p50 | KV util |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, pairs in ratios.items():
        for pair, r in pairs.items():
            cells = [
                _num(r.get(m))
                for m in (
                    "output_throughput",
                    "ttft_p50",
                    "ttft_p99",
                    "tpot_p50",
                    "e2e_p50",
                    "kv_utilization",
                )
            ]
            out.append(f"| {key} | {pair.split('/')[1]} | " + " | ".join(cells) + " |")
    return [*out, "", "Throughput: above 1 means continuous is faster. Latency: below 1 means "
            "continuous is lower.", ""]  # fmt: skip


def _mixed_section(runs: list[Run], scale: float) -> list[str]:
    group = [r for r in runs if r["workload"] == "mixed"]
    if not group:
        return []
    cols = columns(
        "policy",
        "output_throughput",
        "total_throughput",
        "ttft_p50",
        "ttft_p99",
        "tpot_p50",
        "e2e_p50",
        "kv_utilization",
        "padding_waste_prefill",
        "engine_overhead_batch32",
        "replay_efficiency",
        "outputs_equal_to_continuous",
    )
    n = group[0]["num_requests"]
    lengths = "prompts uniform 32–512, 64 new tokens" + (f", ÷ {scale:g}" if scale != 1 else "")
    return [
        f"## Issue 2's workload: {n} requests, {lengths}, one burst — with peers",
        "",
        "`hf-static` is transformers' `generate` on left-padded batches; `hf-continuous` is "
        "transformers' `generate_batch` with `num_blocks` and `max_batch_tokens` set. Same "
        "checkpoint, same threads, greedy; 'same tokens' compares each peer's outputs with "
        "the continuous policy's.",
        "",
        *table(group, cols),
    ]


def _sweep_section(runs: list[Run]) -> list[str]:
    sweep = find_all(runs, suite="batch-sweep")
    if not sweep:
        return []
    cols = columns(
        "policy",
        Column("concurrency", "batch size (clients)"),
        "output_throughput",
        "ttft_p50",
        "ttft_p99",
        "tpot_p50",
        "mean_batch_size",
        "kv_utilization",
        "engine_overhead",
    )
    ordered = sorted(sweep, key=lambda r: (r["policy"], r["concurrency"]))
    return [
        "## Batch-size sweep (the article's table)",
        "",
        "A closed loop of B clients (each sends its next request when its last one is done) "
        "with the policy's max batch size set to B, on the fixed-output lengths.",
        "",
        *table(ordered, cols),
    ]


def _block_section(runs: list[Run], base: int) -> list[str]:
    rows = find_all(runs, suite="block-sweep")
    if not rows:
        return []
    cols = columns(
        "policy",
        "block_size",
        "output_throughput",
        "ttft_p50",
        "ttft_p99",
        "tpot_p50",
        "e2e_p50",
        "kv_utilization",
    )
    ordered = sorted(rows, key=lambda r: (r["policy"], r["block_size"]))
    return [
        f"## Block-size sweep (burst-fixed, {base} concurrent, same KV memory)",
        "",
        "Sizes run interleaved (16, 32, 64, then again where the preset repeats them); "
        "run-to-run noise on a 2-core machine is several percent.",
        "",
        *table(ordered, cols),
    ]


def _poisson_section(runs: list[Run], saturation: float | None) -> list[str]:
    rows = sorted(find_all(runs, suite="poisson"), key=lambda r: (r["load"], r["policy"]))
    if not rows:
        return []
    cols = columns(
        "load",
        "rate",
        "policy",
        "output_throughput",
        "ttft_p50",
        "ttft_p99",
        "tpot_p50",
        "e2e_p50",
        "goodput",
    )
    return [
        "## Poisson arrivals at fractions of continuous's saturation rate",
        "",
        f"Saturation rate: {_num(saturation)} requests/s (continuous on the variable-output "
        "burst). Idle gaps are skipped on the clock, not slept.",
        "",
        *table(rows, cols),
    ]


def _short_long_section(runs: list[Run]) -> list[str]:
    rows = find_all(runs, suite="short-long")
    if not rows:
        return []
    cols = columns(
        "policy",
        "output_throughput",
        "ttft_p50_short",
        "ttft_p99_short",
        "ttft_p50_long",
        "tpot_p50",
        "e2e_p50",
        "kv_utilization",
        "padding_waste",
    )
    return ["## Mostly short prompts with a few very long ones (burst)", "", *table(rows, cols)]


def _maintenance_section(runs: list[Run]) -> list[str]:
    out: list[str] = []
    reserve = sorted(find_all(runs, suite="reserve"), key=lambda r: r["memory_reserve"])
    if reserve:
        cols = columns(
            "memory_reserve",
            "kv_pool_tokens",
            "output_throughput",
            "ttft_p50",
            "ttft_p99",
            COLUMNS["preemptions"].titled("preemptions"),
            "refused",
            "mean_batch_size",
        )
        out += ["## Memory reserve under overload (continuous)", "", *table(reserve, cols)]
    capacity = find_all(runs, suite="capacity")
    if capacity:
        cols = columns(
            "policy",
            "kv_pool_tokens",
            "mean_requests_holding_kv",
            "max_requests_holding_kv",
            "output_throughput",
            "kv_utilization",
            "bookkeeping_bytes",
            "kv_bytes_held_at_peak",
        )
        out += ["## Concurrency at the same KV memory", "", *table(capacity, cols)]
    depth = sorted(
        find_all(runs, suite="hybrid-depth"), key=lambda r: (r["concurrency"], r["policy"])
    )
    if depth:
        cols = columns(
            Column("concurrency", "depth (clients)"),
            "policy",
            "output_throughput",
            "ttft_p50",
            "ttft_p99",
            "tpot_p50",
            "e2e_p50",
        )
        out += ["## Shallow queues: hybrid (one at a time below depth 4) vs continuous", "",
                *table(depth, cols)]  # fmt: skip
    reclaim = find_all(runs, suite="reclaim")
    if reclaim:
        cols = columns(
            "reclaim_every_s",
            "leaked",
            "reclaims",
            "reclaimed_blocks",
            "reclaim_cpu_share",
            "kv_leaked_share",
            "kv_utilization_effective",
            "output_throughput",
            COLUMNS["preemptions"].titled("preemptions"),
        )
        out += ["## Leaked blocks and the reclaim sweep (continuous)", "", *table(reclaim, cols)]
    return out


def _targets_section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["## Issue 7 targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in rows:
        met = {True: "yes", False: "**no**", None: "–"}[t["met"]]
        out.append(f"| {t['name']} | {t['figure']} | {t['goal']} | {met} |")
    return [*out, ""]


def _claims_section(claims: list[dict[str, Any]], command: str) -> list[str]:
    out = [
        "## The article's claims",
        "",
        f"Measured by `{command}`; each verdict is computed from this run's numbers against "
        "the stated threshold.",
        "",
        "| # | claim | measurement | figure | threshold | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in claims:
        verdict = c["verdict"] if c["verdict"] == "holds" else f"**{c['verdict']}**"
        out.append(
            f"| {c['number']} | {c['claim']} | {c['measurement']} | {c['figure']} | "
            f"{c['threshold']} | {verdict}: {c['why']} |"
        )
    return [*out, ""]


def _definitions() -> list[str]:
    return [
        "## Definitions",
        "",
        "- TTFT: first token − arrival (queueing included). TPOT: (last token − first token) / "
        "(output tokens − 1), that is (e2e − TTFT) / (output tokens − 1) for a request that "
        "ends at its last token. ITL: gaps between consecutive tokens, pooled. e2e: finish − "
        "arrival. Percentiles interpolate linearly (vLLM's `benchmark_serving`, numpy's "
        "default). The engine defines these (`RequestMetrics`, `engine.stats.percentile`), so "
        "`/admin/state` gives the same figures for the same requests.",
        "- Throughput: tokens (or requests) completed / duration, duration = run start to last "
        "finish. Goodput: requests meeting both SLOs / duration.",
        "- KV utilization: Σ over steps of tokens stored (after the step's forward) / Σ over "
        "steps of slots held by sequences — a ratio of sums, each step weighted by the slots "
        "it holds, not by its duration. Slots reserved for padding or not-yet-generated tokens "
        "count as held.",
        "- Padding waste: padded / computed tokens; prefill and decode apart (decode padding is "
        "finished rows a padded group keeps computing).",
        "- Engine overhead: (Σ step wall − Σ forward) / Σ step wall; the forward is the model, "
        "logits and sampling (`ModelRunner.last_forward_s`), the bench's own bookkeeping is "
        "taken out of the wall time. 'At batch ≥ 32' keeps only steps of 32 sequences or more.",
        "- Replay bound: the run's recorded batch shapes (per sequence: context, new tokens, "
        "padding, sampled or not) rebuilt and run back to back through the runner alone; its "
        "Σ forward time / the run's busy time is the efficiency.",
        "",
    ]


def write_outputs(
    out_dir: Path,
    preset: Preset,
    machine: dict[str, Any],
    output: BenchOutput,
    plots: bool = True,
    command: str | None = None,
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    command = command or f"servedeck bench --preset {preset.name}"
    doc = results_document(preset, machine, output, command)
    results = out_dir / "results.json"
    results.write_text(json.dumps(doc, indent=1) + "\n")
    images: list[Path] = []
    if plots:
        from bench.plots import write_plots

        images = write_plots(doc, out_dir)
    report = out_dir / "report.md"
    report.write_text(render_markdown(doc, command, _plot_links(images, out_dir)))
    return [results, report, *images]


def _plot_links(images: Sequence[Path], relative_to: Path) -> list[str]:
    if not images:
        return []
    out = ["## Plots", ""]
    for image in images:
        out += [f"![{image.stem}]({os.path.relpath(image, relative_to)})", ""]
    return out


def render_document(results: Path, target: Path, command: str, notes: str = "") -> None:
    """Re-render a saved run's markdown (docs/benchmarks.md, say), plots linked relatively."""
    doc = json.loads(results.read_text())
    images = sorted(results.parent.glob("*.png"))
    target.write_text(render_markdown(doc, command, _plot_links(images, target.parent), notes))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="render a saved results.json as markdown")
    parser.add_argument("results", type=Path)
    parser.add_argument("target", type=Path, help="e.g. docs/benchmarks.md")
    parser.add_argument("--command", help="the command that made the results (default: saved)")
    parser.add_argument("--notes", type=Path, help="markdown to put after the introduction")
    args = parser.parse_args()
    saved = json.loads(args.results.read_text())
    command = args.command or saved.get("command") or f"servedeck bench --preset {saved['preset']}"
    notes = args.notes.read_text() if args.notes else ""
    render_document(args.results, args.target, command, notes)
    print(args.target)
