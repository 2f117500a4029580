"""Where one engine step's time goes: ``python -m bench.step_profile [--label after]``.

In one process, with the bench's threads (``bench.cli.DEFAULT_THREADS``), on the ``small``
checkpoint in float32, it captures two steps of issue 2's mixed workload run by the real engine
(continuous): (a) the first prefill step (a 2,048-token chunk of packed prompts) and (b) the
first decode step with 64 rows (contexts as the workload leaves them). Each is run again through
the runner, timed with plain timers (alternating with its products alone, so both see the
same load) and broken down with ``torch.profiler``. The bound it is held
to: the step's weight products timed alone (the same weights, the same input shapes) plus an
attention lower bound — for prefill, the chunk's causal attention FLOPs at the products' measured
rate; for decode, the K/V bytes the rows read at this machine's measured copy rate.

Writes ``bench/results/step-profile/<label>.json`` and ``<label>.md`` (``--out`` another folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.cli import DEFAULT_THREADS
from bench.plan import SEED
from bench.presets import MIXED_INPUTS, MIXED_OUTPUT, PRESETS
from bench.runner import EngineFactory, EngineSettings
from bench.step_timing import CLOCKS, Timer, weight_products
from bench.suite import model_path
from bench.workloads import mixed
from engine.batch import ScheduledBatch
from engine.sampling_params import SamplingParams

OUT = Path("bench/results/step-profile")
CATEGORIES = (
    ("weight products", ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul")),
    (
        "attention",
        ("scaled_dot_product", "aten::bmm", "aten::baddbmm", "softmax", "flash", "masked_fill"),
    ),
    ("KV writes / token copies", ("aten::index_copy",)),
    ("gathers", ("aten::index_select", "aten::gather", "aten::index")),
    ("sampling", ("argmax", "topk", "multinomial", "log_softmax", "sort")),
)
"""A profiler op (by name fragment) to a row of the table; the rest is elementwise work (norms,
rope, activations) or packing, dtype conversions and allocation, told apart below."""
ELEMENTWISE = ("mul", "add", "rsqrt", "pow", "mean", "silu", "cos", "sin", "neg", "embedding")


class Capture:
    """Stands in for the engine's runner; hands the first batch ``want`` accepts to
    ``measure`` before it runs (its sequences not yet advanced, so it may run many times:
    each run writes the same K/V at the same slots)."""

    def __init__(self, inner: Any, want, measure) -> None:
        self.inner, self.want, self.measure, self.result = inner, want, measure, None

    @property
    def last_forward_s(self) -> float:
        return self.inner.last_forward_s

    def execute(self, batch: ScheduledBatch):
        if self.result is None and self.want(batch):
            self.result = self.measure(self.inner, batch)
        return self.inner.execute(batch)


def _is_prefill(batch: ScheduledBatch) -> bool:
    return sum(e.num_new_tokens for e in batch.entries if e.query_len > 1) >= 2000


def _is_decode64(batch: ScheduledBatch) -> bool:
    return len(batch.entries) == 64 and all(e.query_len == 1 for e in batch.entries)


def capture(factory: EngineFactory, want, measure) -> Any:
    """Runs the mixed workload until ``want`` accepts a step; ``measure(runner, batch)``'s
    result."""
    workload = mixed(64, MIXED_INPUTS, MIXED_OUTPUT, factory.vocab_size, SEED)
    # prefill chunks as large as the step budget: the step profiled is a 2,048-token chunk
    settings = EngineSettings("continuous", {"max_prefill_tokens": 2048})
    engine, recorder = factory.build(settings, time.perf_counter)
    probe = Capture(recorder.inner, want, measure)
    engine.runner = probe
    for i, request in enumerate(workload.requests):
        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(list(request.prompt), params, f"r{i}")
    while probe.result is None:
        if not engine.has_unfinished_requests():
            raise RuntimeError("the workload ended before the step to profile came")
        engine.step()
    return probe.result


def breakdown(runner, batch: ScheduledBatch) -> tuple[dict[str, float], dict[str, float]]:
    """Self CPU seconds per table row, and of the costliest ops, from ``torch.profiler`` over
    one execution."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.execute(batch)
    rows: dict[str, float] = defaultdict(float)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    top = {e.key: e.self_cpu_time_total / 1e6 for e in events[:15]}
    for event in events:
        name, seconds = event.key, event.self_cpu_time_total / 1e6
        for label, fragments in CATEGORIES:
            if any(f in name for f in fragments):
                rows[label] += seconds
                break
        else:
            if any(f"aten::{f}" in name for f in ELEMENTWISE):
                rows["norms, rope, activations"] += seconds
            else:
                rows["packing, dtype, allocation, other"] += seconds
    return dict(rows), top


def profile_step(
    kind: str, runner, batch: ScheduledBatch, rate: float, reps: int, timer: Timer
) -> dict:
    model = runner.model
    config = model.config
    first_s = timer.once(lambda: runner.execute(batch))  # decode rows: gathered after this one
    tokens = sum(e.num_new_tokens + e.num_pad_tokens for e in batch.entries)
    sampled = sum(1 for e in batch.entries if e.sample)
    products, flops = weight_products(model, tokens, sampled)
    steps, weights = timer.paired(lambda: runner.execute(batch), products, reps)
    step_s, weights_s = statistics.median(steps), statistics.median(weights)
    matrix_rate = flops / weights_s
    layers, heads, dim = config.num_hidden_layers, config.num_attention_heads, config.head_dim
    kv_heads = config.num_key_value_heads
    if kind == "prefill":
        pairs = 0
        for e in batch.entries:
            start, q = e.seq.num_computed_tokens, e.num_new_tokens + e.num_pad_tokens
            pairs += q * start + q * (q + 1) // 2
        attention_flops = 4 * heads * dim * pairs * layers
        bound_s = attention_flops / matrix_rate
        bound = {"attention_flops": attention_flops, "matrix_rate_flops": matrix_rate}
    else:
        contexts = [e.seq.num_computed_tokens + 1 for e in batch.entries]
        kv_bytes = sum(contexts) * 2 * kv_heads * dim * 4 * layers
        bound_s = kv_bytes / rate
        bound = {"kv_bytes": kv_bytes, "copy_rate_bytes_per_s": rate}
    parts, top = breakdown(runner, batch)
    stats = getattr(runner.attention, "stats", None)
    return {
        "kind": kind,
        "tokens": tokens,
        "rows": len(batch.entries),
        "contexts": [e.seq.num_computed_tokens for e in batch.entries],
        "step_s": step_s,
        "first_execution_s": first_s,
        "weight_products_s": weights_s,
        "weight_flops": flops,
        "weight_gflops_per_s": matrix_rate / 1e9,
        "attention_bound_s": bound_s,
        **bound,
        "ratio": step_s / (weights_s + bound_s),
        # the prefill bound is at the products' own rate, so it moves with each pair's
        "ratio_paired": statistics.median(
            s / (w + (bound_s * w / weights_s if kind == "prefill" else bound_s))
            for s, w in zip(steps, weights, strict=True)
        ),
        "profile_self_s": parts,
        "top_ops_self_s": top,
        "gather_stats": stats() if callable(stats) else None,
    }


def markdown(label: str, doc: dict) -> str:
    out = [
        f"# Where the time goes — {label}",
        "",
        f"`python -m bench.step_profile --label {label}`: `small`, float32, "
        f"{doc['threads']} torch threads, {doc.get('clock', 'wall')} clock, "
        f"load average {doc['load_average']} at start; "
        f"copy rate {doc['copy_rate_gb_s']:.1f} GB/s. Step and weight-product times "
        f"are medians of {doc['reps']} alternated executions of a step captured from the "
        "mixed workload and of its products alone.",
        "",
        "| | prefill step | decode step |",
        "|---|---:|---:|",
    ]
    p, d = doc["prefill"], doc["decode"]
    ms = 1e3

    def row(name: str, a: str, b: str) -> None:
        out.append(f"| {name} | {a} | {b} |")

    row("tokens / rows", f"{p['tokens']} / {p['rows']}", f"{d['tokens']} / {d['rows']}")
    row("step time", f"{p['step_s'] * ms:.1f} ms", f"{d['step_s'] * ms:.1f} ms")
    row("weight products alone", f"{p['weight_products_s'] * ms:.1f} ms "
        f"({p['weight_gflops_per_s']:.0f} GFLOP/s)", f"{d['weight_products_s'] * ms:.1f} ms "
        f"({d['weight_gflops_per_s']:.0f} GFLOP/s)")  # fmt: skip
    row("attention lower bound", f"{p['attention_bound_s'] * ms:.1f} ms (causal FLOPs)",
        f"{d['attention_bound_s'] * ms:.1f} ms (K/V bytes)")  # fmt: skip
    row("**step / (weights + bound)**", f"**{p['ratio']:.2f}×**", f"**{d['ratio']:.2f}×**")
    row("same, median of the alternated pairs", f"{p['ratio_paired']:.2f}×",
        f"{d['ratio_paired']:.2f}×")  # fmt: skip
    labels = sorted(set(p["profile_self_s"]) | set(d["profile_self_s"]))
    out += ["", "Profiler self time by kind of work (one execution, profiler on):", ""]
    out += ["| work | prefill | decode |", "|---|---:|---:|"]
    for name in labels:
        a, b = p["profile_self_s"].get(name, 0.0), d["profile_self_s"].get(name, 0.0)
        row(name, f"{a * ms:.1f} ms", f"{b * ms:.1f} ms")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--out", type=Path, default=OUT, help="folder for <label>.json/.md")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args(argv)
    timer = Timer(CLOCKS[args.clock])
    torch.set_num_threads(args.threads)
    load = [round(x, 2) for x in os.getloadavg()]
    factory = EngineFactory(model_path(PRESETS["cpu"], None), "cpu", "float32")
    rate = timer.copy_rate()
    doc: dict[str, Any] = {
        "label": args.label,
        "threads": args.threads,
        "clock": args.clock,
        "reps": args.reps,
        "load_average": load,
        "copy_rate_gb_s": rate / 1e9,
    }
    with torch.inference_mode():
        for kind, want in (("prefill", _is_prefill), ("decode", _is_decode64)):
            doc[kind] = capture(
                factory,
                want,
                lambda runner, batch, kind=kind: profile_step(
                    kind, runner, batch, rate, args.reps, timer
                ),
            )
    doc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / f"{args.label}.md").write_text(markdown(args.label, doc))
    print((args.out / f"{args.label}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
