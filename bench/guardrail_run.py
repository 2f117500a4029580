"""The policy engine's measured run (docs/policy-engine.md): one traffic shape, three servers.

Traffic (one trace, replayed on the wall clock by ``servedeck load``): short requests, then a
burst of long prompts, then short requests again. Each run starts a fresh server on
127.0.0.1 (the tiny model, a cost model calibrated here first), puts the same *fixed* setting
in force, sets the guardrail's mode, replays the trace and reads back what happened:

- ``fixed``: the guardrail's kill switch (mode ``off``): the setting stays as the operator set it;
- ``shadow``: the guardrail evaluates and records its decisions, changing nothing;
- ``guardrail``: mode ``on``: it may move the knobs inside the bounds.

For each run: TTFT/TPOT percentiles and output throughput (overall and per phase), the policy
versions stored by the guardrail (with their reasons) and its decisions by outcome.

    python -m bench.guardrail_run --out bench/results/policy-engine
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import child_server
from bench.load import LoadConfig, run_load
from bench.metrics import request_metrics
from engine.checkpoint import default_model_dir
from sim.trace import TraceRequest, Uniform, poisson_trace, write_trace

TOKEN = "policy-engine-run-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MODES = ("fixed", "shadow", "guardrail")


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate: float
    prompt: Uniform
    output: Uniform


@dataclass(frozen=True)
class RunConfig:
    preset: str = "tiny"
    threads: int = 1
    fixed_max_num_seqs: int = 2
    bounds_max_num_seqs: tuple[int, int] = (2, 64)
    ttft_p99_s: float = 2.0
    interval_s: float = 2.0
    window_s: float = 10.0
    min_change_interval_s: float = 4.0
    phases: tuple[Phase, ...] = (
        Phase("short", 20.0, 4.0, Uniform(16, 64), Uniform(16, 32)),
        Phase("long burst", 30.0, 8.0, Uniform(400, 700), Uniform(64, 128)),
        Phase("short again", 30.0, 4.0, Uniform(16, 64), Uniform(16, 32)),
    )
    seed: int = 0


def phased_trace(config: RunConfig) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    start = 0.0
    for i, phase in enumerate(config.phases):
        n = max(1, round(phase.rate * phase.seconds))
        for r in poisson_trace(phase.rate, n, phase.prompt, phase.output, config.seed + i):
            if r.arrived_at < phase.seconds:
                out.append(
                    TraceRequest(start + r.arrived_at, r.num_prefill_tokens, r.num_decode_tokens)
                )
        start += phase.seconds
    return out


def calibrate(model_dir: Path, out: Path, threads: int) -> None:
    argv = [sys.executable, "-m", "control.cli", "calibrate", "--model", str(model_dir)]
    argv += ["--threads", str(threads), "--repeats", "3", "--out", str(out)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def guardrail_body(config: RunConfig, mode: str) -> dict[str, Any]:
    lo, hi = config.bounds_max_num_seqs
    return {
        "mode": mode,
        "objectives": {"ttft_p99_s": config.ttft_p99_s},
        "bounds": {"policies": ["continuous"], "max_num_seqs": {"min": lo, "max": hi}},
        "interval_s": config.interval_s,
        "window_s": config.window_s,
        "min_change_interval_s": config.min_change_interval_s,
        "reason": f"policy-engine run: mode {mode}",
    }


def one_run(
    name: str, config: RunConfig, model_dir: Path, calibration: Path, trace: Path, root: Path
) -> dict[str, Any]:
    workdir = root / name
    workdir.mkdir()
    args = ["--num-threads", str(config.threads), "--cost-model", str(calibration.resolve())]
    args += ["--prediction-timeout-s", "20", "--prediction-max-requests", "300"]
    proc, url = child_server.start_server(model_dir, workdir, TOKEN, args)
    try:
        with httpx.Client(base_url=url, headers=ADMIN, timeout=60) as http:
            fixed = {
                "policy": {
                    "name": "continuous",
                    "params": {"max_num_seqs": config.fixed_max_num_seqs},
                },
                "reason": "the operator's fixed setting",
            }
            http.put("/admin/policy", json=fixed).raise_for_status()
            mode = {"fixed": "off", "shadow": "shadow", "guardrail": "on"}[name]
            http.put("/admin/guardrail", json=guardrail_body(config, mode)).raise_for_status()
            started = time.time()
            result = run_load(LoadConfig(url=url, trace=trace.resolve(), duration_s=None))
            history = http.get("/admin/policy/history", params={"limit": 100}).json()
            status = http.get("/admin/guardrail").json()["status"]
            decisions = http.get("/admin/guardrail/decisions", params={"limit": 200}).json()
    finally:
        child_server.stop_server(proc)
    return summarise(name, config, result, started, history, decisions) | {"status": status}


def summarise(
    name: str,
    config: RunConfig,
    result: Any,
    started: float,
    history: dict[str, Any],
    decisions: dict[str, Any],
) -> dict[str, Any]:
    overall = result.summary()
    phases = []
    begin = 0.0
    for phase in config.phases:
        end = begin + phase.seconds
        records = [
            r for r in result.records if begin <= r.metrics.arrival_time - result.started < end
        ]
        figures = request_metrics(records, phase.seconds, None)
        phases.append({"phase": phase.name} | pick(figures))
        begin = end
    changes = [
        {"version": v["version"], "reason": v["reason"], "params": v["settings"]["policy"]}
        for v in history["items"]
        if v["actor"] == "guardrail"
    ]
    outcomes: dict[str, int] = {}
    for d in decisions["items"]:
        outcomes[d["outcome"]] = outcomes.get(d["outcome"], 0) + 1
    return {
        "run": name,
        "started": started,
        "overall": pick(overall) | {"failed": overall["failed"]},
        "phases": phases,
        "guardrail_versions": changes,
        "decisions_by_outcome": outcomes,
        "decisions": decisions["items"],
    }


def pick(figures: dict[str, Any]) -> dict[str, Any]:
    keys = ("completed", "output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")
    return {k: figures.get(k) for k in keys}


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def render(results: list[dict[str, Any]], config: RunConfig, command: str) -> str:
    lines = [
        f"Objective: TTFT p99 ≤ {config.ttft_p99_s:g} s. Fixed setting: continuous, "
        f"max_num_seqs={config.fixed_max_num_seqs}. Guardrail bounds: max_num_seqs "
        f"{config.bounds_max_num_seqs[0]}–{config.bounds_max_num_seqs[1]}.",
        "",
        f"Command: `{command}`",
        "",
        "| run | phase | requests | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | "
        "TPOT p50 (ms) | TPOT p99 (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows = [("all", r["overall"])] + [(p["phase"], p) for p in r["phases"]]
        for phase, f in rows:
            lines.append(
                f"| {r['run']} | {phase} | {f['completed']} | {f['output_throughput'] or 0:.1f} | "
                f"{ms(f['ttft_p50'])} | {ms(f['ttft_p99'])} | {ms(f['tpot_p50'])} | "
                f"{ms(f['tpot_p99'])} |"
            )
    lines += ["", "| run | versions by the guardrail | decisions by outcome |", "|---|---:|---|"]
    for r in results:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["decisions_by_outcome"].items()))
        lines.append(f"| {r['run']} | {len(r['guardrail_versions'])} | {outcomes or 'none'} |")
    lines += ["", "Versions the guardrail stored (run `guardrail`):", ""]
    for r in results:
        for change in r["guardrail_versions"]:
            lines.append(f"- v{change['version']} {change['params']}: {change['reason']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--runs", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES)
    )
    args = parser.parse_args(argv)
    config = RunConfig()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = default_model_dir(config.preset)
    with tempfile.TemporaryDirectory(prefix="servedeck-policy-engine-") as tmp:
        root = Path(tmp)
        calibration = args.out / "calibration.json"
        if not calibration.is_file():
            print(f"calibrating {model_dir} ...", file=sys.stderr)
            calibrate(model_dir, calibration, config.threads)
        trace = args.out / "trace.csv"
        write_trace(trace, phased_trace(config))
        results = []
        for name in args.runs.split(","):
            print(f"run {name} ...", file=sys.stderr)
            results.append(one_run(name, config, model_dir, calibration, trace, root))
    command = "python -m bench.guardrail_run " + " ".join(argv or sys.argv[1:])
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "report.md").write_text(render(results, config, command))
    print(render(results, config, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
