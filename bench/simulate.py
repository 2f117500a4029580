"""``servedeck simulate``: predict runs with the simulator and write them as ``servedeck bench``
does (results.json in the bench's schema, report.md, plots), so a prediction reads like a
measurement and sits beside one.

A simulated run becomes a bench run through the bench's own pieces: its records and steps make
a ``RunTrace`` (the cost-model runner wrapped in the bench's ``RecordingRunner`` for the padding
split) that ``request_metrics`` and ``engine_metrics`` summarise. Times are the cost model's
virtual seconds; ``engine_overhead`` is left empty (a cost model's step time includes it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from bench import machine
from bench.metrics import engine_metrics, kv_series, request_metrics, ttft_values
from bench.presets import PRESETS, Preset
from bench.recording import RecordingRunner
from bench.report import render_document, write_outputs
from bench.runner import RequestRecord, RunTrace
from bench.suite import BenchOutput
from engine.runner import Runner
from engine.timeline import HeldShare
from policies.queue import QueueSpec
from sim.cost_model import CostModel
from sim.groups import GroupFigures, by_priority, by_tenant
from sim.models import load_cost_model
from sim.simulator import SimResult, SimSetup, simulate
from sim.trace import WORKLOADS, TraceRequest, read_trace, workload_trace

DEFAULT_POLICIES = ("continuous", "dynamic")
OVERHEAD_KEYS = ("engine_overhead", "engine_overhead_batch32", "step_wall_s")
"""Bench keys about this machine's wall time: meaningless for a prediction, left empty."""


@dataclass(frozen=True, slots=True)
class SimWorkload:
    """A trace and how the report files it (bursts as the bench's ``burst-fixed`` suite)."""

    name: str
    suite: str
    requests: list[TraceRequest]
    rate: float | None = None

    @property
    def concurrency(self) -> int | None:
        return len(self.requests) if self.suite == "burst" else None

    @classmethod
    def named(cls, name: str, seed: int = 0) -> SimWorkload:
        requests = workload_trace(name, seed)
        if name.startswith("article-"):
            return cls("burst-fixed", "burst", requests)
        span = requests[-1].arrived_at if len(requests) > 1 else 0.0
        return cls(name, "poisson", requests, (len(requests) - 1) / span if span else None)

    @classmethod
    def from_file(cls, path: Path) -> SimWorkload:
        return cls(path.stem, "trace", read_trace(path))


def run_trace(result: SimResult, recorder: RecordingRunner, start: float) -> RunTrace:
    """The simulated run as the bench's ``RunTrace`` (times on the virtual clock)."""
    records = [
        RequestRecord(r.index, "", r.prompt_tokens, r.metrics, r.tenant, r.priority)
        for r in result.records
    ]
    trace = RunTrace(records, result.steps, recorder.tokens, [], start, 0.0, 0.0, 0.0)
    trace.end, trace.refused = start + result.duration_s, result.refused
    return trace


def run_result(
    workload: SimWorkload,
    policy: str,
    result: SimResult,
    trace: RunTrace,
    preset: Preset,
    wall_s: float,
    queue: QueueSpec | None = None,
) -> dict[str, Any]:
    """One prediction as a bench run (the keys ``bench.suite`` writes for a measured one)."""
    setup_policy = result.policy
    run: dict[str, Any] = {
        "id": f"sim/{workload.name}/{workload.concurrency or len(workload.requests)}/{policy}",
        "suite": workload.suite,
        "policy": policy,
        "policy_params": setup_policy.params.model_dump() if setup_policy else {},
        "workload": workload.name,
        "concurrency": workload.concurrency,
        "num_requests": len(workload.requests),
        "block_size": result.block_size,
        "kv_pool_tokens": result.num_kv_blocks * result.block_size,
        "rate": workload.rate,
        "load": None,
        "refused": result.refused,
        "simulated": True,
        "cost_model": result.cost_model,
        "busy_s": result.busy_s,
        "sim_wall_s": wall_s,
    }
    run |= request_metrics(trace.requests, result.duration_s, preset.slo)
    cost = queue.cost() if queue is not None else None
    run["queue"] = queue.model_dump() if queue is not None else None
    run["tenants"] = [g.model_dump() for g in by_tenant(trace.requests, cost)]
    run["priorities"] = [g.model_dump() for g in by_priority(trace.requests, cost)]
    run |= engine_metrics(trace)
    run |= dict.fromkeys(OVERHEAD_KEYS)
    simulated = run["prompt_tokens"] + run["output_tokens"]
    run["sim_tokens_per_wall_s"] = simulated / wall_s if wall_s > 0 else None
    run["us_per_seq_step"] = (
        wall_s / sum(s.num_seqs for s in result.steps) * 1e6 if result.steps else None
    )
    return run


def simulate_recorded(
    requests: Sequence[TraceRequest],
    cost_model: CostModel,
    policy: str,
    setup: SimSetup,
    queue: QueueSpec | None = None,
) -> tuple[SimResult, RecordingRunner]:
    """``simulate`` with the cost-model runner inside the bench's ``RecordingRunner``."""
    recorders: list[RecordingRunner] = []

    def wrap(runner: Runner) -> Runner:
        recorders.append(RecordingRunner(runner))
        return recorders[-1]

    result = simulate(requests, cost_model, policy, setup, wrap_runner=wrap, queue=queue)
    return result, recorders[0]


def simulate_all(
    workloads: Sequence[SimWorkload],
    cost_model: CostModel,
    policies: Sequence[str],
    setup: SimSetup,
    preset: Preset,
    queue: QueueSpec | None = None,
) -> BenchOutput:
    output = BenchOutput([], {}, [], None)
    for workload in workloads:
        for policy in policies:
            started = time.perf_counter()
            result, recorder = simulate_recorded(
                workload.requests, cost_model, policy, setup, queue
            )
            wall = time.perf_counter() - started
            start = min((r.arrived_at for r in workload.requests), default=0.0)
            trace = run_trace(result, recorder, start)
            run = run_result(workload, policy, result, trace, preset, wall, queue)
            output.runs.append(run)
            output.series[run["id"]] = {**kv_series(trace), "ttft": ttft_values(trace.requests)}
            print(_summary(run), flush=True)
            print(wait_line(result.waits), flush=True)
    return output


def _summary(run: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        value = run.get(key)
        return "-" if value is None else f"{value * 1e3:.0f} ms"

    lines = [
        f"{run['id']}: {run['output_throughput'] or 0:.0f} output tok/s, TTFT p50 "
        f"{ms('ttft_p50')} p99 {ms('ttft_p99')}, KV utilization {run['kv_utilization'] or 0:.1%}, "
        f"{run['preemptions']} preemptions (simulated in {run['sim_wall_s']:.1f} s)"
    ]
    for kind, label in (("tenants", "tenant"), ("priorities", "priority")):
        groups = [GroupFigures.model_validate(g) for g in run.get(kind) or []]
        if len(groups) > 1:
            lines += [f"  {label} {g.key}: {_group_line(g)}" for g in groups]
    return "\n".join(lines)


def wait_line(waits: tuple[HeldShare, ...]) -> str:
    """The run's waiting by what held the queue's head: each reason's share and seconds."""
    seconds = {share.reason: share.seconds for share in waits}
    shares = HeldShare.fractions(waits)
    if not shares:
        return "  waiting by reason: none"
    parts = [f"{r.value} {f:.1%} ({seconds[r]:.2f} s)" for r, f in shares.items()]
    return "  waiting by reason: " + ", ".join(parts)


def _group_line(g: GroupFigures) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.0f} ms"

    weight = "" if g.weight_share is None else f" (weight {g.weight_share:.1%})"
    return (
        f"{g.requests} requests, {g.share:.1%} of service{weight}, TTFT p50 "
        f"{ms(g.ttft_p50_s)} p99 {ms(g.ttft_p99_s)}, TPOT p50 {ms(g.tpot_p50_s)}"
    )


def _queue_arg(text: str) -> QueueSpec:
    """``--queue``: a discipline's name or its JSON setting (validated by ``QueueSpec``)."""
    raw = text.strip()
    spec = json.loads(raw) if raw.startswith("{") else {"name": raw}
    try:
        return TypeAdapter[QueueSpec](QueueSpec).validate_python(spec)
    except ValidationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help="predict policies on a trace with a cost model; writes results.json, report, plots",
    )
    p.add_argument("--profile", required=True, help="gpu/model (a100-80g/llama3-8b) or a JSON file")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="CSV: arrived_at,num_prefill_tokens,...")
    source.add_argument(
        "--workload", help=f"comma-separated: {', '.join(WORKLOADS)} (or article-N, poisson-RATE)"
    )
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated")
    p.add_argument("--out", type=Path, help="output folder (default bench/results/sim-<profile>)")
    p.add_argument("--seed", type=int, default=0, help="seed of the named workloads")
    p.add_argument("--no-plots", action="store_true")
    defaults = SimSetup()
    for knob in ("block_size", "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks"):
        p.add_argument(f"--{knob.replace('_', '-')}", type=int, default=getattr(defaults, knob))
    p.add_argument("--memory-reserve", type=float, default=defaults.memory_reserve)
    p.add_argument(
        "--queue",
        type=_queue_arg,
        help="queue discipline: fcfs, priority, fair, or its JSON setting, e.g. "
        '\'{"name": "fair", "weights": {"A": 2}}\' (default fcfs); the trace\'s tenant and '
        "priority columns say whose each request is",
    )
    add_search_flags(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    cost_model = load_cost_model(args.profile)
    if args.trace:
        workloads = [SimWorkload.from_file(args.trace)]
    else:
        workloads = [SimWorkload.named(n.strip(), args.seed) for n in args.workload.split(",")]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    setup = SimSetup(
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_kv_blocks=args.num_kv_blocks,
        memory_reserve=args.memory_reserve,
    )
    if args.search:
        return search_main(args, cost_model, workloads[0].requests, policies, setup)
    bursts = sorted({w.concurrency for w in workloads if w.concurrency})
    preset = replace(
        PRESETS["seed"],
        name=f"simulated {cost_model.name}",
        concurrencies=tuple(bursts) or (len(workloads[0].requests),),
        kv_tokens=0,
        policies=tuple(policies),
    )
    output = simulate_all(workloads, cost_model, policies, setup, preset, args.queue)
    if output.runs:
        preset = replace(preset, kv_tokens=output.runs[0]["kv_pool_tokens"])
    info = machine.describe(1, f"simulated: {cost_model.name}")
    info = machine.finish(info, time.perf_counter() - started)
    info["cost_model"] = cost_model.name
    out = args.out or Path("bench") / "results" / f"sim-{cost_model.name.replace('/', '-')}"
    command = command_line(args)
    paths = write_outputs(out, preset, info, output, not args.no_plots, command)
    render_document(out / "results.json", out / "report.md", command, notes(cost_model))
    for path in paths:
        print(path)
    return 0


def add_search_flags(p: argparse.ArgumentParser) -> None:
    """``--search``: capacity search (sim/search.py) instead of one run per policy."""
    p.add_argument("--search", action="store_true", help="find each policy's highest rate")
    p.add_argument("--slo", default="ttft_p99=2s,tpot_p99=100ms", help="e.g. ttft_p99=500ms,...")
    p.add_argument("--search-requests", type=int, default=500, help="trace size per probe")
    for knob in ("max_num_seqs", "max_num_batched_tokens", "memory_reserve"):
        flag = f"--search-{knob.replace('_', '-')}"
        p.add_argument(flag, help=f"comma-separated {knob} values to try (default: a small grid)")


def search_main(
    args: argparse.Namespace,
    cost_model: CostModel,
    requests: list[TraceRequest],
    policies: list[str],
    setup: SimSetup,
) -> int:
    """The workload's lengths and gaps made denser per rate until the SLO breaks."""
    from sim.search import Grid, Slo, format_search, search, search_trace

    grid = Grid.of(
        max_num_seqs=args.search_max_num_seqs,
        max_num_batched_tokens=args.search_max_num_batched_tokens,
        memory_reserve=args.search_memory_reserve,
    )
    trace_at = search_trace(requests, args.search_requests)
    print(format_search(search(trace_at, cost_model, policies, Slo.parse(args.slo), grid, setup)))
    return 0


def notes(cost_model: CostModel) -> str:
    return (
        f"**A prediction, not a measurement.** Every figure below comes from the simulator: "
        f"the real engine, policies and block manager stepping on a virtual clock, each step "
        f"timed by the cost model `{cost_model.name}` (sim/). The machine lines above describe "
        "the computer that ran the simulation, not the one predicted; engine overhead is part "
        "of the cost model's step time and is not reported apart."
    )


def command_line(args: argparse.Namespace) -> str:
    source = f"--trace {args.trace}" if args.trace else f"--workload {args.workload}"
    return f"servedeck simulate --profile {args.profile} {source} --policies {args.policies}"


def run(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="servedeck simulate")
    sub = parser.add_subparsers()
    add_parser(sub)
    return main(parser.parse_args(["simulate", *(argv or [])]))
