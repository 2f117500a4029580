"""The Poisson sweep (issue 40, step 6): for each engine, the highest Poisson rate at which
TTFT p99 stays within 2 s over 200 requests, found rate by rate and resumable anywhere.

Each rate is one ``vllm bench serve`` run on a freshly started server (``side_by_side.run_once``:
the same model folder, client, prompts and settings as the side-by-side), its result file
written as it finishes (``raw/sweep-r<rate>-<engine>-0.json``). The search is a pure function
of the rates already measured (``Search.next_rate``), so a run stopped anywhere — by
``--budget-s``, a timeout or a crash — resumes where it stopped when started again on the same
``--out``: rates with a result file are read, not run again. The engines alternate (vLLM's next
rate, then servedeck's, ...) so both see the same stretch of the machine's day.

The search: from ``--start`` the rate grows by ``--factor`` while every rate passes; once a
rate fails (TTFT p99 over the limit, or a request failed), the gap between the highest passing
and the lowest failing rate is bisected (geometric mean) until the failing rate is within
``--resolution`` of the passing one. A first rate that fails halves until one passes or the
rate falls under ``--floor`` (the engine then keeps up with none tried).

``PYTHONPATH=. .venv/bin/python -m bench.vllm.sweep --peer-venv /work/.venv-vllm
[--dtype bfloat16] [--budget-s 1200]`` writes ``sweep.json`` and ``sweep.md`` in ``--out``
(default ``bench/results/vllm/sweep-<dtype>``) after every rate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.vllm.hf_model import DEFAULT_OUT, ensure_hf_model
from bench.vllm.side_by_side import (
    ROOT,
    PeerVenvError,
    Plan,
    check_peer_venv,
    git_commit,
    planned,
    run_once,
    run_plan,
)
from bench.vllm.summary import (
    ENGINES,
    BenchResult,
    Engine,
    ResultError,
    WorkloadSpec,
    read_result,
)

TTFT_P99_LIMIT_MS = 2000.0
REQUESTS = 200
RATE_DECIMALS = 3


def passes(result: BenchResult, limit_ms: float = TTFT_P99_LIMIT_MS) -> bool:
    """Every request answered and TTFT p99 within the limit."""
    return (
        result.failed == 0
        and result.completed == result.num_prompts
        and result.p99_ttft_ms <= limit_ms
    )


@dataclass(frozen=True, slots=True)
class Search:
    """Where the search starts, how it grows, when it stops."""

    start: float = 0.5
    factor: float = 1.5
    resolution: float = 0.1
    """Stop once the lowest failing rate is within this fraction above the highest passing."""
    floor: float = 0.05

    def __post_init__(self) -> None:
        if self.start <= 0 or self.factor <= 1 or self.resolution <= 0 or self.floor <= 0:
            raise ValueError(f"not a search: {self}")

    def next_rate(self, outcomes: Mapping[float, bool]) -> float | None:
        """The next rate to measure given the pass/fail of those measured; None when done."""
        if not outcomes:
            return self.start
        passed = [rate for rate, ok in outcomes.items() if ok]
        failed = [rate for rate, ok in outcomes.items() if not ok]
        if not passed:
            lower = _rounded(min(failed) / 2)
            return None if lower < self.floor or lower in outcomes else lower
        lowest_fail = min(failed, default=None)
        below = [rate for rate in passed if lowest_fail is None or rate < lowest_fail]
        if not below:  # a pass only above the lowest failure: noise; search under the failure
            lower = _rounded(lowest_fail / 2) if lowest_fail is not None else self.start
            return None if lower < self.floor or lower in outcomes else lower
        highest_pass = max(below)
        if lowest_fail is None:
            return _rounded(highest_pass * self.factor)
        if lowest_fail <= highest_pass * (1 + self.resolution):
            return None
        middle = _rounded(math.sqrt(highest_pass * lowest_fail))
        return None if middle in outcomes else middle

    def best(self, outcomes: Mapping[float, bool]) -> float | None:
        """The highest passing rate under the lowest failing one (None: none passed)."""
        lowest_fail = min((r for r, ok in outcomes.items() if not ok), default=math.inf)
        below = [r for r, ok in outcomes.items() if ok and r < lowest_fail]
        return max(below, default=None)


DEFAULT_SEARCH = Search()


def _rounded(rate: float) -> float:
    return round(rate, RATE_DECIMALS)


def spec_for(rate: float, requests: int) -> WorkloadSpec:
    return WorkloadSpec(f"sweep-r{rate:g}", requests, rate, 1)


def result_path(out: Path, engine: Engine, rate: float) -> Path:
    """Where ``run_once`` writes a rate's result (``raw/<spec>-<engine>-0.json``)."""
    return out / "raw" / f"sweep-r{rate:g}-{engine}-0.json"


def measured(out: Path, engine: Engine) -> dict[float, BenchResult]:
    """The rates with a result already in ``out``, read back (the resumable state)."""
    found: dict[float, BenchResult] = {}
    for path in sorted((out / "raw").glob(f"sweep-r*-{engine}-0.json")):
        rate_text = path.name.removeprefix("sweep-r").removesuffix(f"-{engine}-0.json")
        try:
            found[float(rate_text)] = read_result(path)
        except (ValueError, ResultError) as error:
            print(f"[sweep] ignoring {path}: {error}", file=sys.stderr, flush=True)
    return found


@dataclass(frozen=True, slots=True)
class RateRow:
    rate: float
    passed: bool
    p99_ttft_ms: float
    median_ttft_ms: float
    median_tpot_ms: float
    output_throughput: float
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class EngineSweep:
    engine: Engine
    best_rate: float | None
    """The highest rate with TTFT p99 within the limit; None if none passed."""
    done: bool
    """The search has nothing left to measure (False: resume to finish it)."""
    rates: list[RateRow] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SweepSummary:
    dtype: str
    threads: int
    requests: int
    ttft_p99_limit_ms: float
    search: Search
    servedeck_commit: str
    engines: list[EngineSweep]

    @property
    def ratio(self) -> float | None:
        """servedeck's best rate over vLLM's, once both are known."""
        best = {e.engine: e.best_rate for e in self.engines}
        ours, theirs = best.get("servedeck"), best.get("vllm")
        return None if not ours or not theirs else ours / theirs


def summarize(
    results: Mapping[Engine, Mapping[float, BenchResult]],
    search: Search,
    limit_ms: float,
) -> list[EngineSweep]:
    sweeps = []
    for engine in ENGINES:
        by_rate = results.get(engine, {})
        outcomes = {rate: passes(r, limit_ms) for rate, r in by_rate.items()}
        rows = [
            RateRow(
                rate=rate,
                passed=outcomes[rate],
                p99_ttft_ms=r.p99_ttft_ms,
                median_ttft_ms=r.median_ttft_ms,
                median_tpot_ms=r.median_tpot_ms,
                output_throughput=r.output_throughput,
                completed=r.completed,
                failed=r.failed,
            )
            for rate, r in sorted(by_rate.items())
        ]
        done = search.next_rate(outcomes) is None
        sweeps.append(EngineSweep(engine, search.best(outcomes), done, rows))
    return sweeps


def markdown(summary: SweepSummary) -> str:
    limit_s = summary.ttft_p99_limit_ms / 1000
    lines = [
        f"# Poisson sweep, {summary.dtype}, {summary.threads} threads",
        "",
        f"The highest rate with TTFT p99 ≤ {limit_s:g} s over {summary.requests} requests "
        f"(servedeck {summary.servedeck_commit}); search {asdict(summary.search)}.",
        "",
        "| engine | best rate (req/s) | search |",
        "|---|---|---|",
    ]
    for sweep in summary.engines:
        best = "none passed" if sweep.best_rate is None else f"{sweep.best_rate:g}"
        lines.append(f"| {sweep.engine} | {best} | {'done' if sweep.done else 'unfinished'} |")
    if summary.ratio is not None:
        lines += ["", f"servedeck / vLLM: **{summary.ratio:.2f}×**"]
    lines += [
        "",
        "| engine | rate | TTFT p99 (ms) | TTFT p50 (ms) | TPOT p50 (ms) | output tok/s | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for sweep in summary.engines:
        for row in sweep.rates:
            mark = "pass" if row.passed else f"fail ({row.completed} done, {row.failed} failed)"
            lines.append(
                f"| {sweep.engine} | {row.rate:g} | {row.p99_ttft_ms:.0f} | "
                f"{row.median_ttft_ms:.0f} | {row.median_tpot_ms:.0f} | "
                f"{row.output_throughput:.1f} | {mark} |"
            )
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: SweepSummary) -> str:
    (out / "sweep.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    text = markdown(summary)
    (out / "sweep.md").write_text(text)
    return text


def sweep(plan: Plan, search: Search, requests: int, limit_ms: float, budget_s: float) -> int:
    """Measure the next rate of each engine in turn until both searches are done or the
    budget is spent (no new run starts after it); the summary is rewritten after each."""
    started = time.monotonic()
    while True:
        progressed = False
        for engine in ENGINES:
            if time.monotonic() - started > budget_s:
                print(f"[sweep] budget of {budget_s:.0f} s spent: run again to resume")
                return 0
            outcomes = {r: passes(res, limit_ms) for r, res in measured(plan.out, engine).items()}
            rate = search.next_rate(outcomes)
            if rate is None:
                continue
            record = run_once(plan, engine, spec_for(rate, requests), 0)
            result = read_result(plan.out / record.result_file)
            verdict = "pass" if passes(result, limit_ms) else "fail"
            print(
                f"[sweep] {engine} at {rate:g} req/s: TTFT p99 {result.p99_ttft_ms:.0f} ms, "
                f"{result.output_throughput:.1f} tok/s: {verdict}",
                flush=True,
            )
            write_summary(plan.out, summary_of(plan, search, requests, limit_ms))
            progressed = True
        if not progressed:
            return 0


def summary_of(plan: Plan, search: Search, requests: int, limit_ms: float) -> SweepSummary:
    results = {engine: measured(plan.out, engine) for engine in ENGINES}
    return SweepSummary(
        dtype=plan.dtype,
        threads=plan.threads,
        requests=requests,
        ttft_p99_limit_ms=limit_ms,
        search=search,
        servedeck_commit=git_commit(),
        engines=summarize(results, search, limit_ms),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--peer-venv", type=Path, required=True, help="bench/vllm/venv.sh DIR")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--servedeck-model", type=Path, help="what servedeck loads instead")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=REQUESTS, help="requests per rate")
    parser.add_argument("--ttft-p99-limit-ms", type=float, default=TTFT_P99_LIMIT_MS)
    parser.add_argument("--start", type=float, default=DEFAULT_SEARCH.start, help="req/s")
    parser.add_argument("--factor", type=float, default=DEFAULT_SEARCH.factor)
    parser.add_argument("--resolution", type=float, default=DEFAULT_SEARCH.resolution)
    parser.add_argument(
        "--budget-s", type=float, default=math.inf, help="start no run after this many seconds"
    )
    parser.add_argument("--out", type=Path, help="default bench/results/vllm/sweep-<dtype>")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        peer = check_peer_venv(args.peer_venv)
        search = Search(args.start, args.factor, args.resolution)
    except (PeerVenvError, ValueError) as error:
        print(f"sweep: {error}", file=sys.stderr)
        return 2
    model_dir = ensure_hf_model(args.model_dir, None)
    out: Path = args.out or ROOT / "bench" / "results" / "vllm" / f"sweep-{args.dtype}"
    limit_ms = args.ttft_p99_limit_ms
    with planned(peer, model_dir, args.servedeck_model, args.dtype, args.threads, out) as plan:
        code = run_plan(
            plan, lambda p: sweep(p, search, args.requests, limit_ms, args.budget_s), "sweep"
        )
    print(write_summary(plan.out, summary_of(plan, search, args.requests, limit_ms)))
    return code


if __name__ == "__main__":
    sys.exit(main())
