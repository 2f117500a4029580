"""The prefill budget against the decode batch cap, on the simulator (issue 16):
``python -m bench.budget_grid --calibration bench/results/calibration/small-cpu.json``.

Issue 16 asks for a prefill budget with TPOT p50 ≤ 2× dynamic's and output tok/s ≥ 90 % of
the 2,048-budget row on the `cpu` preset's 100-request variable burst. The measured curve
(``bench.prefill_budget``) misses it at every budget; this grid asks whether any pair of
``max_num_seqs`` × ``max_prefill_tokens`` would meet it, on the clock of this machine's
calibrated cost model (``sim/``: the real policies, a predicted clock, no load noise). Each
``max_num_seqs`` has its own 2,048 row, so a smaller decode batch is judged against itself.
Writes ``grid.json`` and ``grid.md`` beside the curve.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BUDGETS = (16, 32, 64, 128, 256, 2048)
MAX_NUM_SEQS = (None, 64, 32, 16)
OUT = Path("bench") / "results" / "prefill-budget"


def grid(calibration: Path, budgets: Sequence[int], seqs: Sequence[int | None]) -> dict[str, Any]:
    from bench import workloads as wl
    from bench.plan import SEED
    from bench.presets import PRESETS
    from bench.suite import model_path
    from engine.model.formats import read_model_config
    from engine.stats import percentile
    from sim.calibrated import CalibratedModel
    from sim.simulator import SimSetup, simulate
    from sim.trace import TraceRequest

    preset = PRESETS["cpu"]
    model = CalibratedModel.load(calibration)
    vocab = read_model_config(model_path(preset, None)).vocab_size
    workload = wl.burst(100, True, preset.scale, vocab, SEED)
    trace = [TraceRequest(0.0, len(r.prompt), r.max_tokens) for r in workload.requests]
    setup = SimSetup(num_kv_blocks=preset.kv_tokens // 16)

    def row(name: str, params: dict[str, Any]) -> dict[str, Any]:
        result = simulate(trace, model, {"name": name, "params": params}, setup)
        tpot = [r.metrics.tpot for r in result.records if r.metrics.tpot is not None]
        ttft = [r.metrics.ttft for r in result.records if r.metrics.ttft is not None]
        out = sum(r.output_tokens for r in result.records)
        return {
            "policy": name,
            **params,
            "output_throughput": out / result.duration_s,
            "tpot_p50": percentile(tpot, 50),
            "ttft_p99": percentile(ttft, 99),
        }

    dynamic = row("dynamic", {"length_window": preset.scaled_window})
    rows = []
    for cap in seqs:
        extra = {} if cap is None else {"max_num_seqs": cap}
        for budget in budgets:
            rows.append(row("continuous", {"max_prefill_tokens": budget, **extra}))
    return {
        "cost_model": model.name,
        "prompt_tokens": workload.prompt_tokens,
        "output_tokens": workload.output_tokens,
        "dynamic": dynamic,
        "runs": rows,
    }


def table(doc: dict[str, Any]) -> str:
    dyn = doc["dynamic"]
    lines = [
        "| max_num_seqs | max_prefill_tokens | output tok/s | vs its 2,048 row | TPOT p50 ms | "
        "TPOT p50 / dynamic | TTFT p99 ms | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"]:
        cap = r.get("max_num_seqs")
        top = max(
            (x for x in doc["runs"] if x.get("max_num_seqs") == cap),
            key=lambda x: x["max_prefill_tokens"],
        )
        share = r["output_throughput"] / top["output_throughput"]
        tpot = r["tpot_p50"] / dyn["tpot_p50"]
        ok = "**meets**" if tpot <= 2 and share >= 0.9 else "misses"
        lines.append(
            f"| {cap or 'default'} | {r['max_prefill_tokens']} | {r['output_throughput']:.1f} | "
            f"{share:.0%} | {r['tpot_p50'] * 1000:.1f} | {tpot:.2f}× | "
            f"{r['ttft_p99'] * 1000:.0f} | {ok} |"
        )
    lines.append(
        f"| dynamic | - | {dyn['output_throughput']:.1f} | - | {dyn['tpot_p50'] * 1000:.1f} | "
        f"1.00× | {dyn['ttft_p99'] * 1000:.0f} | - |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget_grid", description=__doc__)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    doc = grid(args.calibration, BUDGETS, MAX_NUM_SEQS)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grid.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = args.out / "grid.md"
    md.write_text(
        f"Predicted by the simulator on `{doc['cost_model']}` (not measured): the `cpu` "
        f"preset's 100-request variable burst, {doc['prompt_tokens']} prompt and "
        f"{doc['output_tokens']} output tokens.\n\n" + table(doc) + "\n"
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
