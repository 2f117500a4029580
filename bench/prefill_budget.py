"""The prefill-budget curve (issue 16): continuous at several ``max_prefill_tokens`` and
dynamic alongside, on the `cpu` preset's 100-request variable-output burst, in one process.

``python -m bench.prefill_budget`` writes ``bench/results/prefill-budget/results.json``,
``report.md`` and ``prefill_budget.png``. Every round runs every setting once on the same
request list; a second round (``--rounds 2``, the default) shows the run-to-run spread.
The machine's load average is recorded before and after each run: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BUDGETS = (128, 256, 512, 1024, 2048)
CONCURRENCY = 100
KEYS = ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50")
OUT = Path("bench") / "results" / "prefill-budget"


def run(budgets: Sequence[int], rounds: int, threads: int) -> dict[str, Any]:
    import torch

    from bench import machine
    from bench.plan import SEED, Plan, RunSpec
    from bench.presets import PRESETS
    from bench.runner import EngineFactory
    from bench.suite import Bench, model_path

    preset = PRESETS["cpu"]
    torch.set_num_threads(threads)
    started = time.perf_counter()
    info = machine.describe(threads, "cpu")
    factory = EngineFactory(model_path(preset, None), "cpu", "float32")
    plan_of = Plan(preset, ("continuous", "dynamic"), (), factory.vocab_size)
    workload = plan_of.burst(CONCURRENCY, variable=True)
    rows: list[dict[str, Any]] = []
    for rep in range(1, rounds + 1):
        specs: list[RunSpec] = [
            RunSpec(
                "prefill-budget", "dynamic", workload, plan_of.settings("dynamic"), {"rep": rep}
            )
        ]
        for budget in budgets:
            settings = plan_of.settings("continuous")
            settings.policy_params["max_prefill_tokens"] = budget
            labels = {"max_prefill_tokens": budget, "rep": rep}
            specs.append(RunSpec("prefill-budget", "continuous", workload, settings, labels))
        for spec in specs:
            load = machine.load_average()
            bench = Bench(preset, factory, [spec], label=f"round {rep}: {spec.id}")
            result = bench.run().runs[0]
            result["max_prefill_tokens"] = spec.labels.get("max_prefill_tokens")
            result["load_average_before"] = load
            result["load_average_after"] = machine.load_average()
            rows.append({k: result.get(k) for k in _kept()})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # a run's figures at once
    info = machine.finish(info, time.perf_counter() - started)
    info["model"], info["dtype"], info["seed"] = str(factory.model_dir), "float32", SEED
    return {
        "machine": info,
        "workload": {
            "name": workload.name,
            "requests": len(workload.requests),
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
            "scale": preset.scale,
            "kv_pool_tokens": preset.kv_tokens,
        },
        "runs": rows,
    }


def predict(budgets: Sequence[int], calibration: Path) -> dict[str, Any]:
    """The same curve from the simulator (sim/): the real engine and policies on the clock of
    this machine's calibrated cost model, so the machine's load does not enter. A prediction,
    never a measurement; lengths from the bench's own request list."""
    from bench import workloads as wl
    from bench.plan import SEED
    from bench.presets import PRESETS
    from engine.model.formats import read_model_config
    from engine.stats import percentile
    from sim.calibrated import CalibratedModel
    from sim.simulator import SimSetup, simulate
    from sim.trace import TraceRequest

    preset = PRESETS["cpu"]
    model = CalibratedModel.load(calibration)
    vocab = read_model_config(_model_dir()).vocab_size
    workload = wl.burst(CONCURRENCY, True, preset.scale, vocab, SEED)
    trace = [TraceRequest(0.0, len(r.prompt), r.max_tokens) for r in workload.requests]
    setup = SimSetup(num_kv_blocks=preset.kv_tokens // 16)
    specs: list[tuple[str, dict[str, int], int | None]] = [
        ("dynamic", {"length_window": preset.scaled_window}, None)
    ]
    specs += [("continuous", {"max_prefill_tokens": b}, b) for b in budgets]
    rows = []
    for name, params, budget in specs:
        result = simulate(trace, model, {"name": name, "params": params}, setup)
        ttft = [r.metrics.ttft for r in result.records if r.metrics.ttft is not None]
        tpot = [r.metrics.tpot for r in result.records if r.metrics.tpot is not None]
        out = sum(r.output_tokens for r in result.records)
        row: dict[str, str | int | float | None] = {
            "policy": name,
            "max_prefill_tokens": budget,
            "repeat": "predicted",
        }
        row |= {"output_throughput": out / result.duration_s, "e2e_p50": None}
        row |= {f"ttft_p{q}": percentile(ttft, q) for q in (50, 99)}
        row |= {f"tpot_p{q}": percentile(tpot, q) for q in (50, 99)}
        rows.append(row | {"load_average_before": None})
    return {"cost_model": model.name, "runs": rows}


def _model_dir() -> Path:
    from bench.presets import PRESETS
    from bench.suite import model_path

    return model_path(PRESETS["cpu"], None)


def _kept() -> tuple[str, ...]:
    return ("id", "policy", "max_prefill_tokens", "repeat", *KEYS, "steps", "duration_s",
            "completed", "load_average_before", "load_average_after")  # fmt: skip


def _cell(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" if key == "output_throughput" else f"{value * 1000:.0f}"


def table(doc: dict[str, Any]) -> str:
    """One row per run, rounds apart, with each row's share of its round's 2,048 row."""
    head = "| round | policy | max_prefill_tokens | output tok/s | vs 2,048 | TTFT p50 ms | "
    head += "TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | TPOT p50 / dynamic | e2e p50 ms | load |"
    lines = [head, "|" + "---|" * 12]
    for row in doc["runs"]:
        same = [r for r in doc["runs"] if r["repeat"] == row["repeat"]]
        top = next((r for r in same if r["max_prefill_tokens"] == max(BUDGETS)), None)
        dyn = next((r for r in same if r["policy"] == "dynamic"), None)
        share = row["output_throughput"] / top["output_throughput"] if top else None
        tpot = row["tpot_p50"] / dyn["tpot_p50"] if dyn and dyn["tpot_p50"] else None
        cells = [
            str(row["repeat"]),
            row["policy"],
            str(row["max_prefill_tokens"] or "-"),
            _cell("output_throughput", row["output_throughput"]),
            "n/a" if share is None else f"{share:.0%}",
            *(_cell(k, row[k]) for k in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")),
            "n/a" if tpot is None else f"{tpot:.2f}×",
            _cell("e2e_p50", row["e2e_p50"]),
            str(row["load_average_before"][0] if row.get("load_average_before") else "n/a"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(doc: dict[str, Any]) -> str:
    """Issue 16's goal per budget and round, ratios within the round: TPOT p50 <= 2x
    dynamic's and output tok/s >= 90 % of the 2,048 row."""
    lines = ["| max_prefill_tokens | " + " | ".join(
        f"round {r}" for r in sorted({r["repeat"] for r in doc["runs"]})) + " |"]  # fmt: skip
    rounds = sorted({r["repeat"] for r in doc["runs"]})
    lines.append("|" + "---|" * (len(rounds) + 1))
    budgets = sorted({r["max_prefill_tokens"] for r in doc["runs"] if r["max_prefill_tokens"]})
    for budget in budgets:
        cells = []
        for rep in rounds:
            same = {r["max_prefill_tokens"]: r for r in doc["runs"] if r["repeat"] == rep}
            row, top, dyn = same.get(budget), same.get(max(budgets)), same.get(None)
            if not (row and top and dyn and dyn["tpot_p50"] and top["output_throughput"]):
                cells.append("n/a")
                continue
            tpot = row["tpot_p50"] / dyn["tpot_p50"]
            share = row["output_throughput"] / top["output_throughput"]
            ok = "**meets**" if tpot <= 2 and share >= 0.9 else "misses"
            cells.append(f"{ok} (TPOT {tpot:.2f}×, tok/s {share:.0%})")
        lines.append(f"| {budget} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(doc: dict[str, Any], out: Path) -> Path:
    """Every measured round, and the simulator's curve (predicted.json) when there is one;
    latencies on a log scale (the rounds differ by the machine's load)."""
    from bench.plots import COLORS, _pyplot, _save

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (
        (("output_throughput",), 1.0, "output tokens/s"),
        (("ttft_p50", "ttft_p99"), 1000.0, "TTFT ms (p50 solid, p99 dashed)"),
        (("tpot_p50", "tpot_p99"), 1000.0, "TPOT ms (p50 solid, p99 dashed)"),
    )
    for ax, (names, scale, label) in zip(axes, panels, strict=True):
        for rep in sorted({r["repeat"] for r in doc["runs"]}):
            rows = [r for r in doc["runs"] if r["repeat"] == rep]
            cont = [r for r in rows if r["policy"] == "continuous"]
            cont.sort(key=lambda r: r["max_prefill_tokens"])
            dyn = next((r for r in rows if r["policy"] == "dynamic"), None)
            alpha = 1.0 if rep == 1 else 0.45
            for name, dashes in zip(names, ("-", "--"), strict=False):
                ys = [r[name] * scale for r in cont]
                xs = [r["max_prefill_tokens"] for r in cont]
                tag = f"{name} (round {rep})"
                ax.plot(xs, ys, dashes + "o", color=COLORS["continuous"], alpha=alpha,
                        label=f"continuous {tag}")  # fmt: skip
                if dyn is not None and dyn.get(name) is not None:
                    ax.axhline(dyn[name] * scale, color=COLORS["dynamic"], linestyle=dashes,
                               alpha=alpha, label=f"dynamic {tag}")  # fmt: skip
        predicted = out / "predicted.json"
        if predicted.exists():
            rows = [r for r in json.loads(predicted.read_text())["runs"] if r["max_prefill_tokens"]]
            rows.sort(key=lambda r: r["max_prefill_tokens"])
            for name, dashes in zip(names, ("-", "--"), strict=False):
                ax.plot([r["max_prefill_tokens"] for r in rows], [r[name] * scale for r in rows],
                        dashes + "x", color="black", label=f"predicted {name}")  # fmt: skip
        if scale != 1.0:
            ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(BUDGETS), [str(b) for b in BUDGETS])
        ax.set_xlabel("max_prefill_tokens (continuous)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("prefill budget, burst-variable@100 (cpu preset, small, float32)")
    return _save(fig, out / "prefill_budget.png")


def write(doc: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json"
    results.write_text(json.dumps(doc, indent=1) + "\n")
    m = doc["machine"]
    w = doc["workload"]
    report = out / "report.md"
    report.write_text(
        "# Prefill budget curve (issue 16)\n\n"
        f"`python -m bench.prefill_budget` on {m['cpu_count']} × {m['cpu_model']}, "
        f"{m['torch_threads']} torch threads, torch {m['torch']}, model {m['model']} "
        f"({m['dtype']}); wall {m['bench_wall_s']} s. Load average {m['load_average_start']} "
        f"at start, {m['load_average_end']} at the end (per run: the `load` column, 1-minute); "
        f"matmul probe {m['matmul_gflops_start']} → {m['matmul_gflops_end']} GFLOP/s.\n\n"
        f"Workload: {w['name']}, {w['requests']} requests at t=0, {w['prompt_tokens']} prompt "
        f"and {w['output_tokens']} output tokens (the `cpu` preset: the article's lengths / "
        f"{w['scale']:g}); KV pool {w['kv_pool_tokens']} token slots; continuous at its "
        "defaults but for `max_prefill_tokens`, the step budget 2,048.\n\n"
        + table(doc)
        + "\n\nThe goal (TPOT p50 ≤ 2× dynamic's, output tok/s ≥ 90 % of the 2,048 row, "
        "both within one round):\n\n" + goals(doc) + "\n"
    )
    return [results, report, plot(doc, out)]


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="python -m bench.prefill_budget", description=__doc__)
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the bench's)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--replot", action="store_true", help="redraw from results.json only")
    parser.add_argument(
        "--predict",
        type=Path,
        metavar="CALIBRATION",
        help="also write predicted.md: the curve simulated on a calibrated cost model",
    )
    args = parser.parse_args(argv)
    if args.predict:
        budgets = tuple(int(b) for b in args.budgets.split(","))
        predicted = predict(budgets, args.predict)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "predicted.json").write_text(json.dumps(predicted, indent=1) + "\n")
        (args.out / "predicted.md").write_text(
            f"Predicted by the simulator on `{predicted['cost_model']}` (not measured):\n\n"
            + table(predicted)
            + "\n"
        )
        print(args.out / "predicted.md")
        if not args.replot:
            return 0
    if args.replot:
        doc = json.loads((args.out / "results.json").read_text())
    else:
        budgets = tuple(int(b) for b in args.budgets.split(","))
        doc = run(budgets, args.rounds, args.threads)
    for path in write(doc, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
