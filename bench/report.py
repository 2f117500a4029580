"""results.json and report.md (the article-style tables, ratios, targets and claims)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import sections
from bench.claims import judge
from bench.presets import Preset
from bench.ratios import Run, compute_ratios, find_all
from bench.suite import BenchOutput
from bench.tables import CORE, columns, table
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
    out += sections.ratios_section(doc["ratios"])
    out += sections.mixed_section(runs, settings.get("mixed_scale", 1))
    out += sections.sweep_section(runs)
    out += sections.block_section(runs, base)
    out += sections.poisson_section(runs, settings.get("saturation_rate"))
    out += sections.short_long_section(runs)
    out += sections.maintenance_section(runs)
    out += sections.targets_section(doc["targets"])
    out += sections.definitions()
    if doc["skipped"]:
        out += ["## Skipped", "", *[f"- {s}" for s in doc["skipped"]], ""]
    out += plots
    out += sections.claims_section(doc["claims"], command)
    return "\n".join(out)


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


KEPT_MARKER = "<!-- sections below are kept when this page is re-rendered -->"
"""In a rendered page, everything from this line on (sections written by hand or by other
tools: loading memory, load testers, ...) survives ``render_document``."""


def kept_tail(target: Path) -> str:
    """The part of an existing page from ``KEPT_MARKER`` on ("" when absent)."""
    if not target.exists():
        return ""
    text = target.read_text()
    at = text.find(KEPT_MARKER)
    return text[at:] if at >= 0 else ""


def render_document(results: Path, target: Path, command: str, notes: str = "") -> None:
    """Re-render a saved run's markdown (docs/benchmarks.md, say), plots linked relatively;
    the page's sections from ``KEPT_MARKER`` on are kept as they are."""
    doc = json.loads(results.read_text())
    images = sorted(results.parent.glob("*.png"))
    page = render_markdown(doc, command, _plot_links(images, target.parent), notes)
    tail = kept_tail(target) or KEPT_MARKER + "\n"
    target.write_text(page.rstrip("\n") + "\n\n" + tail)


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
