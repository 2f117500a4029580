"""Who goes first, measured (issue 27): fair share between two tenants and an interactive
class beside a flooding batch class, on the real engine (the ``small`` preset, its forward
included, ``bench.runner.drive``) and on the simulator (the same traces, the calibrated cost
model), side by side.

Rates are multiples of the server's capacity, measured first in the same run: the requests
per second a burst of each shape finishes at under ``continuous``. Every run of an experiment
replays the very same trace (same arrivals, same lengths), for the same arrival window, and
drains; only the queue discipline differs.

- **Two tenants** (the VTC paper's setting): A sends 4× B's rate, together 3× capacity (A
  2.4×, B 0.6×), so both stay backlogged. Under ``fcfs``, ``fair`` (equal weights) and
  ``fair`` with weights A:B = 2:1: the service difference over every interval in which both
  are backlogged (against VTC's bound), B's TTFT, the service ratio.
- **Interactive beside batch**: interactive requests (priority 0, short prompts, Poisson at
  0.1× their capacity) beside a batch class (priority 10, longer, at 1.5× its capacity). Under
  ``fcfs`` and ``priority``: the interactive TTFT p99 and the total output tok/s.

    .venv/bin/python -m bench.fairness [--duration 20] [--rounds 2] [--out bench/results/fairness]

Writes ``fairness.json``, ``report.md`` and the plots into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, TypeAdapter

from bench.runner import (
    EngineFactory,
    EngineSettings,
    Hooks,
    RequestRecord,
    RunTrace,
    SkipClock,
    drive,
)
from bench.workloads import Request, Span, Workload, uniform
from engine.checkpoint import default_model_dir
from engine.config import config_default
from engine.tenants import ServiceCost
from policies.queue import QueueSpec
from sim.calibrated import CalibratedModel
from sim.groups import GroupFigures, by_priority, by_tenant
from sim.simulator import SimSetup, simulate
from sim.trace import TraceRequest

HERE = Path(__file__).parent
DEFAULT_OUT = HERE / "results" / "fairness"
CALIBRATION = HERE / "results" / "fairness" / "small-cpu.json"
"""Fitted with ``servedeck calibrate`` on the day of the runs (the engine changed since
``results/calibration/small-cpu.json``: the native decode attention halved decode_context)."""
POLICY = "continuous"
KV_TOKENS = 32768
CAPACITY_BURST = 64

TENANT_SHAPE = (Span(36, 143), Span(14, 14))
"""The bench ``cpu`` preset's lengths (as the calibration's accuracy runs)."""
INTERACTIVE_SHAPE = (Span(8, 32), Span(14, 14))
BATCH_SHAPE = (Span(64, 256), Span(32, 32))
A_RATE, B_RATE = 2.4, 0.6
INTERACTIVE_RATE, BATCH_RATE = 0.1, 1.5
INTERACTIVE, BATCH = 0, 10

_QUEUE = TypeAdapter[QueueSpec](QueueSpec)


def queue(**spec: Any) -> QueueSpec:
    return _QUEUE.validate_python(spec)


@dataclass(frozen=True, slots=True)
class Variant:
    label: str
    queue: QueueSpec


def poisson(
    rate: float,
    duration: float,
    shape: tuple[Span, Span],
    vocab: int,
    seed: int,
    tenant: str,
    priority: int,
) -> list[Request]:
    """Requests of one class arriving as a Poisson process over ``duration`` seconds."""
    rng = random.Random(f"{tenant}:{priority}:{seed}")
    now, out = rng.expovariate(rate), []
    while now < duration:
        prompt = tuple(rng.randrange(2, vocab) for _ in range(shape[0].draw(rng)))
        out.append(Request(prompt, shape[1].draw(rng), now, tenant, tenant, priority))
        now += rng.expovariate(rate)
    return out


def merged(name: str, *classes: list[Request]) -> Workload:
    return Workload(name, tuple(sorted((r for c in classes for r in c), key=lambda r: r.arrival)))


def trace_of(workload: Workload) -> list[TraceRequest]:
    return [
        TraceRequest(r.arrival, len(r.prompt), r.max_tokens, 0, r.tenant, r.priority)
        for r in workload.requests
    ]


class Capacity(BaseModel):
    shape: str
    requests: int
    seconds: float
    rps: float


def capacity(factory: EngineFactory, shape: tuple[Span, Span], label: str) -> Capacity:
    """Requests per second a burst of this shape finishes at (continuous, fcfs)."""
    burst = uniform(label, CAPACITY_BURST, *shape, factory.vocab_size, 11)
    engine, recorder = factory.build(EngineSettings(POLICY, kv_tokens=KV_TOKENS), SkipClock())
    trace = drive(engine, recorder, burst)
    seconds = trace.end - trace.start
    return Capacity(
        shape=label, requests=CAPACITY_BURST, seconds=seconds, rps=CAPACITY_BURST / seconds
    )


class Backlogged(BaseModel):
    """Two tenants' service while both had requests waiting (VTC's setting)."""

    seconds: float = 0.0
    max_difference: float = 0.0
    """Max over sub-intervals of |ΔW_A/w_A − ΔW_B/w_B|: max minus min of the difference."""
    service_ratio: float | None = None
    """ΔW_A / ΔW_B over the longest such interval."""


def backlogged(trace: RunTrace, cost: ServiceCost, a: str, b: str) -> Backlogged:
    """The longest run of steps after which both tenants had requests not yet scheduled."""
    best: list[tuple[float, float, float]] = []
    current: list[tuple[float, float, float]] = []
    for when, samples in trace.tenants:
        by_name = {s.tenant: s for s in samples}
        sa, sb = by_name.get(a), by_name.get(b)
        if sa is None or sb is None or not (sa.queued and sb.queued):
            best, current = max(best, current, key=len), []
            continue
        wa = cost.input_weight * sa.input_tokens + cost.output_weight * sa.output_tokens
        wb = cost.input_weight * sb.input_tokens + cost.output_weight * sb.output_tokens
        current.append((when, wa, wb))
    best = max(best, current, key=len)
    if len(best) < 2:
        return Backlogged()
    diffs = [wa / cost.weight(a) - wb / cost.weight(b) for _, wa, wb in best]
    served_b = best[-1][2] - best[0][2]
    return Backlogged(
        seconds=best[-1][0] - best[0][0],
        max_difference=max(diffs) - min(diffs),
        service_ratio=(best[-1][1] - best[0][1]) / served_b if served_b > 0 else None,
    )


class Run(BaseModel):
    label: str
    side: str
    """``measured`` (the engine and its model) or ``simulated`` (the calibrated cost model)."""
    queue: dict[str, Any]
    duration_s: float
    output_tokens_per_s: float
    window_output_tokens_per_s: float
    """Output tokens sampled within the arrival window, per second of it."""
    refused: int
    rounds_output_tokens_per_s: list[float] = []
    rounds_window_output_tokens_per_s: list[float] = []
    """Measured: each round's figures (the groups and the rest are the first round's)."""
    tenants: list[GroupFigures]
    priorities: list[GroupFigures]
    window_share: dict[str, float]
    """Each tenant's (or class's) share of the weighted service served within the arrival
    window, while the load lasts (over the whole run every request is served, so whole-run
    shares only restate the arrivals)."""
    backlogged: Backlogged | None = None


def _window_share(
    records: Sequence[RequestRecord], start: float, window: float, cost: ServiceCost, kind: str
) -> dict[str, float]:
    """Weighted service within the window by group: a prompt counts once scheduled, an
    output token once sampled."""
    end = start + window
    served: dict[str, float] = {}
    for r in records:
        key = r.tenant if kind == "tenants" else str(r.priority)
        scheduled = r.metrics.first_scheduled_time
        prompt = r.prompt_tokens if scheduled is not None and scheduled <= end else 0
        outputs = sum(1 for t in r.metrics.token_times if t <= end)
        served[key] = served.get(key, 0.0) + (
            cost.input_weight * prompt + cost.output_weight * outputs
        )
    total = sum(served.values())
    return {k: v / total for k, v in sorted(served.items())} if total else {}


def _window_rate(records: Sequence[RequestRecord], start: float, window: float) -> float:
    tokens = sum(sum(1 for t in r.metrics.token_times if t - start <= window) for r in records)
    return tokens / window


def measured(
    factory: EngineFactory, workload: Workload, variant: Variant, window: float, pair: bool
) -> tuple[Run, RunTrace]:
    settings = EngineSettings(POLICY, kv_tokens=KV_TOKENS, queue=variant.queue)
    engine, recorder = factory.build(settings, SkipClock())
    trace = drive(engine, recorder, workload, Hooks(watch_tenants=pair))
    cost = variant.queue.cost()
    duration = trace.end - trace.start
    records = trace.requests
    run = Run(
        label=variant.label,
        side="measured",
        queue=variant.queue.model_dump(),
        duration_s=duration,
        output_tokens_per_s=sum(r.output_tokens for r in records) / duration,
        window_output_tokens_per_s=_window_rate(records, trace.start, window),
        refused=trace.refused,
        tenants=by_tenant(records, cost),
        priorities=by_priority(records, cost),
        window_share=_window_share(
            records, trace.start, window, cost, "tenants" if pair else "priorities"
        ),
        backlogged=backlogged(trace, cost, "A", "B") if pair else None,
    )
    return run, trace


def simulated(
    model: CalibratedModel, workload: Workload, variant: Variant, window: float, pair: bool
) -> Run:
    setup = SimSetup(num_kv_blocks=KV_TOKENS // config_default("block_size"))
    result = simulate(trace_of(workload), model, POLICY, setup, queue=variant.queue)
    cost = variant.queue.cost()
    records = [
        RequestRecord(r.index, "", r.prompt_tokens, r.metrics, r.tenant, r.priority)
        for r in result.records
    ]
    start = min(r.metrics.arrival_time for r in records)
    return Run(
        label=variant.label,
        side="simulated",
        queue=variant.queue.model_dump(),
        duration_s=result.duration_s,
        output_tokens_per_s=sum(r.output_tokens for r in records) / result.duration_s,
        window_output_tokens_per_s=_window_rate(records, start, window),
        refused=result.refused,
        tenants=by_tenant(records, cost),
        priorities=by_priority(records, cost),
        window_share=_window_share(
            records, start, window, cost, "tenants" if pair else "priorities"
        ),
    )


class Experiment(BaseModel):
    name: str
    description: str
    requests: int
    arrival_window_s: float
    rates: dict[str, float]
    """Each class's arrival rate as a multiple of its shape's measured capacity."""
    runs: list[Run]


class Document(BaseModel):
    model: str
    policy: str
    threads: int
    calibration: str
    capacities: list[Capacity]
    vtc_bound: dict[str, float]
    experiments: list[Experiment]
    goals: dict[str, Any]
    wall_s: float


def _group(run: Run, key: str, kind: str = "tenants") -> GroupFigures:
    groups = run.tenants if kind == "tenants" else run.priorities
    return next(g for g in groups if g.key == key)


def _run(exp: Experiment, label: str, side: str = "measured") -> Run:
    return next(r for r in exp.runs if r.label == label and r.side == side)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _paired(a: list[float], b: list[float]) -> float:
    """The median of the rounds' ratios (each round's runs side by side)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def goals(pair: Experiment, classes: Experiment, bound: float) -> dict[str, Any]:
    """The issue's goals, read off the runs (the simulator's agreement per run)."""
    fcfs, fair, weighted = (_run(pair, x) for x in ("fcfs", "fair", "fair 2:1"))
    fcfs_c, prio = _run(classes, "fcfs"), _run(classes, "priority")
    out: dict[str, Any] = {
        "fair_max_difference": fair.backlogged.max_difference if fair.backlogged else None,
        "vtc_bound": bound,
        "b_ttft_p99_fair_over_fcfs": _ratio(
            _group(fair, "B").ttft_p99_s, _group(fcfs, "B").ttft_p99_s
        ),
        "weighted_service_ratio": weighted.backlogged.service_ratio
        if weighted.backlogged
        else None,
        "interactive_ttft_p99_priority_over_fcfs": _ratio(
            _group(prio, str(INTERACTIVE), "priorities").ttft_p99_s,
            _group(fcfs_c, str(INTERACTIVE), "priorities").ttft_p99_s,
        ),
        "output_tok_s_priority_over_fcfs": _paired(
            prio.rounds_output_tokens_per_s, fcfs_c.rounds_output_tokens_per_s
        ),
        "window_output_tok_s_priority_over_fcfs": _paired(
            prio.rounds_window_output_tokens_per_s, fcfs_c.rounds_window_output_tokens_per_s
        ),
        "rounds_output_tok_s": {
            "fcfs": fcfs_c.rounds_output_tokens_per_s,
            "priority": prio.rounds_output_tokens_per_s,
        },
    }
    agreement = []
    for exp, kind in ((pair, "tenants"), (classes, "priorities")):
        for run in exp.runs:
            if run.side != "measured":
                continue
            sim = _run(exp, run.label, "simulated")
            for g in run.tenants if kind == "tenants" else run.priorities:
                s = _group(sim, g.key, kind)
                agreement.append(
                    {
                        "experiment": exp.name,
                        "run": run.label,
                        "group": g.key,
                        "share_measured": run.window_share.get(g.key, 0.0),
                        "share_simulated": sim.window_share.get(g.key, 0.0),
                        "share_error": abs(
                            sim.window_share.get(g.key, 0.0) - run.window_share[g.key]
                        )
                        / run.window_share[g.key]
                        if run.window_share.get(g.key)
                        else None,
                        "ttft_p50_measured": g.ttft_p50_s,
                        "ttft_p50_simulated": s.ttft_p50_s,
                        "ttft_p50_error": abs(s.ttft_p50_s - g.ttft_p50_s) / g.ttft_p50_s
                        if s.ttft_p50_s is not None and g.ttft_p50_s
                        else None,
                    }
                )
    out["simulator"] = agreement
    return out


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{1000 * x:.0f}"


def report(doc: Document) -> str:
    """The results as markdown tables (docs/fairness.md quotes them)."""
    lines = [
        f"Model `{doc.model}`, policy `{doc.policy}`, {doc.threads} threads; simulator: "
        f"`{doc.calibration}`. Capacities: "
        + ", ".join(f"{c.shape} {c.rps:.1f} req/s" for c in doc.capacities)
        + f". Wall time {doc.wall_s:.0f} s.",
        "",
    ]
    for exp in doc.experiments:
        kind = "tenants" if exp.name == "two-tenants" else "priorities"
        rates = ", ".join(f"{k} {v:g}×" for k, v in exp.rates.items())
        lines += [
            f"### {exp.name}",
            "",
            f"{exp.description} {exp.requests} requests over {exp.arrival_window_s:g} s "
            f"(rates as multiples of capacity: {rates}), then drained.",
            "",
            "| run | side | group | requests | share in window | weight share | TTFT p50 ms | "
            "TTFT p99 ms | TPOT p50 ms | out tok/s | out tok/s in window |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for run in exp.runs:
            for g in run.tenants if kind == "tenants" else run.priorities:
                ws = "–" if g.weight_share is None or kind != "tenants" else f"{g.weight_share:.3f}"
                lines.append(
                    f"| {run.label} | {run.side} | {g.key} | {g.requests} "
                    f"| {run.window_share.get(g.key, 0.0):.3f} | {ws} "
                    f"| {_ms(g.ttft_p50_s)} | {_ms(g.ttft_p99_s)} | {_ms(g.tpot_p50_s)} "
                    f"| {run.output_tokens_per_s:.0f} | {run.window_output_tokens_per_s:.0f} |"
                )
        lines.append("")
        if kind == "tenants":
            lines += [
                "| run | both backlogged s | max service difference | A/B service ratio |",
                "|---|---:|---:|---:|",
            ]
            for run in exp.runs:
                if run.backlogged is not None:
                    b = run.backlogged
                    ratio = "–" if b.service_ratio is None else f"{b.service_ratio:.2f}"
                    lines.append(
                        f"| {run.label} | {b.seconds:.1f} | {b.max_difference:.0f} | {ratio} |"
                    )
            lines.append("")
    seen = doc.goals
    lines += ["### Goals", "", "| goal | target | seen |", "|---|---|---|"]

    def fmt(x: float | None, digits: int = 3) -> str:
        return "–" if x is None else f"{x:.{digits}f}"

    lines += [
        f"| fair: max service difference (both backlogged) | ≤ VTC bound {seen['vtc_bound']:.0f} "
        f"| {fmt(seen['fair_max_difference'], 0)} |",
        f"| fair: B's TTFT p99 ÷ under fcfs | ≤ 0.333 | {fmt(seen['b_ttft_p99_fair_over_fcfs'])} |",
        f"| fair 2:1: A/B service | 2 ± 10 % | {fmt(seen['weighted_service_ratio'])} |",
        f"| priority: interactive TTFT p99 ÷ under fcfs | ≤ 0.25 "
        f"| {fmt(seen['interactive_ttft_p99_priority_over_fcfs'])} |",
        "| priority: output tok/s ÷ under fcfs (makespan; median of the rounds' ratios: "
        + "; ".join(
            f"{k} " + ", ".join(f"{v:.0f}" for v in vs)
            for k, vs in seen["rounds_output_tok_s"].items()
        )
        + ") | ≥ 0.95 "
        f"| {fmt(seen['output_tok_s_priority_over_fcfs'])} |",
        f"| priority: output tok/s ÷ under fcfs (arrival window) | ≥ 0.95 "
        f"| {fmt(seen['window_output_tok_s_priority_over_fcfs'])} |",
        "",
        "| experiment | run | group | share in window measured | simulated | error "
        "| TTFT p50 measured ms | simulated ms | error |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for a in seen["simulator"]:
        lines.append(
            f"| {a['experiment']} | {a['run']} | {a['group']} | {a['share_measured']:.3f} "
            f"| {a['share_simulated']:.3f} | {fmt(a['share_error'], 2)} "
            f"| {_ms(a['ttft_p50_measured'])} | {_ms(a['ttft_p50_simulated'])} "
            f"| {fmt(a['ttft_p50_error'], 2)} |"
        )
    return "\n".join(lines) + "\n"


def plots(doc: Document, traces: dict[str, RunTrace], window: float, out: Path) -> list[Path]:
    """Service over time per tenant (measured, each discipline); TTFT per class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    cost = ServiceCost()
    fig, axes = plt.subplots(1, len(traces), figsize=(5 * len(traces), 3.6), sharey=True)
    for ax, (label, trace) in zip(axes, traces.items(), strict=True):
        for tenant, color in (("A", "#1f77b4"), ("B", "#d62728")):
            xs, ys = [], []
            for when, samples in trace.tenants:
                s = next((x for x in samples if x.tenant == tenant), None)
                if s is not None:
                    xs.append(when - trace.start)
                    ys.append(
                        cost.input_weight * s.input_tokens + cost.output_weight * s.output_tokens
                    )
            ax.plot(xs, ys, label=f"tenant {tenant}", color=color)
        ax.axvline(window, color="#7f7f7f", linestyle="--", linewidth=1)
        ax.set_title(label)
        ax.set_xlabel("seconds (dashed: arrivals end)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("weighted service (1·input + 2·output tokens)")
    axes[0].legend()
    fig.suptitle("Two tenants, A at 4× B's rate (measured)")
    fig.tight_layout()
    paths.append(out / "two-tenants-service.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    classes = next(e for e in doc.experiments if e.name == "interactive-batch")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels, width = [], 0.2
    for i, run in enumerate(classes.runs):
        values = [
            (g.ttft_p99_s or 0.0) for g in run.priorities if g.key in (str(INTERACTIVE), str(BATCH))
        ]
        ax.bar(
            [x + i * width for x in range(len(values))],
            values,
            width,
            label=f"{run.label} ({run.side})",
        )
        labels = [f"priority {g.key}" for g in run.priorities]
    ax.set_xticks([x + width * (len(classes.runs) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT p99 (s, log)")
    ax.set_title("Interactive (priority 0) beside a flooding batch class (priority 10)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    paths.append(out / "interactive-batch-ttft.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def rerender(out: Path) -> None:
    """``report.md`` again from a saved ``fairness.json`` (no run)."""
    doc = Document.model_validate_json((out / "fairness.json").read_text())
    (out / "report.md").write_text(report(doc))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="arrival window, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="measured runs of each variant")
    parser.add_argument("--calibration", default=str(CALIBRATION))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    began = time.perf_counter()
    threads = 2
    torch.set_num_threads(threads)
    factory = EngineFactory(default_model_dir("small"))
    model = CalibratedModel.load(args.calibration)
    vocab = factory.vocab_size
    drive(
        *factory.build(EngineSettings(POLICY), SkipClock()),
        uniform("warm", 8, *TENANT_SHAPE, vocab, 9),
    )
    caps = [
        capacity(factory, TENANT_SHAPE, "tenant (36-143 in, 14 out)"),
        capacity(factory, INTERACTIVE_SHAPE, "interactive (8-32 in, 14 out)"),
        capacity(factory, BATCH_SHAPE, "batch (64-256 in, 32 out)"),
    ]
    print(" ".join(f"{c.shape}: {c.rps:.1f} req/s" for c in caps), flush=True)
    window, seed = args.duration, args.seed
    pair = merged(
        "two-tenants",
        poisson(A_RATE * caps[0].rps, window, TENANT_SHAPE, vocab, seed, "A", 0),
        poisson(B_RATE * caps[0].rps, window, TENANT_SHAPE, vocab, seed, "B", 0),
    )
    classes = merged(
        "interactive-batch",
        poisson(
            INTERACTIVE_RATE * caps[1].rps,
            window,
            INTERACTIVE_SHAPE,
            vocab,
            seed,
            "interactive",
            INTERACTIVE,
        ),
        poisson(BATCH_RATE * caps[2].rps, window, BATCH_SHAPE, vocab, seed, "batch", BATCH),
    )
    pair_variants = [
        Variant("fcfs", queue(name="fcfs")),
        Variant("fair", queue(name="fair")),
        Variant("fair 2:1", queue(name="fair", weights={"A": 2, "B": 1})),
    ]
    class_variants = [
        Variant("fcfs", queue(name="fcfs")),
        Variant("priority", queue(name="priority")),
    ]
    traces: dict[str, RunTrace] = {}
    experiments = []
    for name, workload, variants, rates, description in (
        (
            "two-tenants",
            pair,
            pair_variants,
            {"A": A_RATE, "B": B_RATE},
            "Tenants A and B, A at 4× B's rate, both backlogged.",
        ),
        (
            "interactive-batch",
            classes,
            class_variants,
            {"interactive": INTERACTIVE_RATE, "batch": BATCH_RATE},
            "Interactive (priority 0, 8-32 tokens in) beside batch "
            "(priority 10, 64-256 in, 32 out).",
        ),
    ):
        runs = []
        first: dict[str, Run] = {}
        for round_ in range(args.rounds):
            # alternate the order round by round, so a drift of the machine's speed
            # spreads over every variant
            for variant in variants if round_ % 2 == 0 else variants[::-1]:
                run, trace = measured(factory, workload, variant, window, name == "two-tenants")
                print(
                    f"{name} {variant.label} round {round_ + 1}: {run.duration_s:.1f} s, "
                    f"{run.output_tokens_per_s:.0f} tok/s",
                    flush=True,
                )
                kept = first.setdefault(variant.label, run)
                kept.rounds_output_tokens_per_s.append(run.output_tokens_per_s)
                kept.rounds_window_output_tokens_per_s.append(run.window_output_tokens_per_s)
                if name == "two-tenants" and round_ == 0:
                    traces[variant.label] = trace
        for variant in variants:
            runs.append(first[variant.label])
            runs.append(simulated(model, workload, variant, window, name == "two-tenants"))
        experiments.append(
            Experiment(
                name=name,
                description=description,
                requests=len(workload.requests),
                arrival_window_s=window,
                rates=rates,
                runs=runs,
            )
        )
    max_prompt = max(TENANT_SHAPE[0].hi, 1)
    cost = ServiceCost()
    max_num_seqs = config_default("max_num_seqs")
    bound = 2 * max(
        cost.input_weight * max_prompt, cost.output_weight * max_num_seqs * TENANT_SHAPE[1].hi
    )
    doc = Document(
        model="small (random weights, float32)",
        policy=POLICY,
        threads=threads,
        calibration=str(Path(args.calibration).name),
        capacities=caps,
        vtc_bound={
            "bound": bound,
            "input_weight": cost.input_weight,
            "output_weight": cost.output_weight,
            "max_input_tokens": max_prompt,
            "max_num_seqs": max_num_seqs,
            "max_output_tokens": TENANT_SHAPE[1].hi,
        },
        experiments=experiments,
        goals=goals(experiments[0], experiments[1], bound),
        wall_s=time.perf_counter() - began,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fairness.json").write_text(json.dumps(doc.model_dump(), indent=1) + "\n")
    (args.out / "report.md").write_text(report(doc))
    plots(doc, traces, window, args.out)
    print(report(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
