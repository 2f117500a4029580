"""The side-by-side's pure part: `vllm bench serve` result files in, the summary out.

Nothing here starts a process or imports vLLM or torch: ``side_by_side`` runs the servers and
the client and hands this module the result files, the probe's rates and the model's
``config.json``. The result keys are the ones vLLM 0.32.0's ``vllm/benchmarks/serve.py``
writes with ``--save-result`` (without ``--save-detailed``): ``output_throughput``,
``median_ttft_ms``, ``p99_ttft_ms``, ``median_tpot_ms``, ``p99_itl_ms``...

The roofline counts the weight products only: a prompt token costs 2 FLOP per parameter of
the decoder's linear layers (no lm-head: vLLM and servedeck run it on a prompt's last token
only), an output token 2 FLOP per parameter with the lm-head. The embedding is a lookup and the
attention's own products (a few per cent at these lengths) are left out, so the ceiling is
slightly generous: no engine can beat it on that machine at that probe's rate.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Engine = Literal["vllm", "servedeck"]
ENGINES: tuple[Engine, ...] = ("vllm", "servedeck")
"""The order of every alternation: A (vLLM), B (servedeck), A, B..."""


class ResultError(ValueError):
    """A result file that is not what ``vllm bench serve --save-result`` writes."""


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One ``vllm bench serve --save-result`` file: the figures the summary reads."""

    num_prompts: int
    request_rate: float | None
    """Requests per second; None for ``inf`` (every request at t0, a burst)."""
    completed: int
    failed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    median_ttft_ms: float
    p99_ttft_ms: float
    median_tpot_ms: float
    p99_tpot_ms: float
    median_itl_ms: float
    p99_itl_ms: float

    @classmethod
    def from_json(cls, data: Mapping[str, object], origin: str = "result") -> BenchResult:
        def number(key: str) -> float:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ResultError(f"{origin}: {key!r} is {value!r}, not a number")
            return float(value)

        def count(key: str) -> int:
            value = number(key)
            if value != int(value):
                raise ResultError(f"{origin}: {key!r} is {value!r}, not a count")
            return int(value)

        rate = data.get("request_rate")
        return cls(
            num_prompts=count("num_prompts"),
            request_rate=None if rate == "inf" else number("request_rate"),
            completed=count("completed"),
            failed=count("failed"),
            duration=number("duration"),
            total_input_tokens=count("total_input_tokens"),
            total_output_tokens=count("total_output_tokens"),
            request_throughput=number("request_throughput"),
            output_throughput=number("output_throughput"),
            total_token_throughput=number("total_token_throughput"),
            median_ttft_ms=number("median_ttft_ms"),
            p99_ttft_ms=number("p99_ttft_ms"),
            median_tpot_ms=number("median_tpot_ms"),
            p99_tpot_ms=number("p99_tpot_ms"),
            median_itl_ms=number("median_itl_ms"),
            p99_itl_ms=number("p99_itl_ms"),
        )


def read_result(path: Path) -> BenchResult:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ResultError(f"{path}: {error}") from error
    if not isinstance(data, dict):
        raise ResultError(f"{path}: not a JSON object")
    return BenchResult.from_json(data, origin=str(path))


@dataclass(frozen=True, slots=True)
class Spread:
    """The median and the range of one figure over a workload's runs on one engine."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no runs")
        return cls(median=statistics.median(values), low=min(values), high=max(values))


@dataclass(frozen=True, slots=True)
class EngineSummary:
    """One engine on one workload over its runs: medians over the runs of each run's figure
    (the p99 columns are the median of the runs' p99s, not a p99 of the pooled requests)."""

    engine: Engine
    runs: int
    output_throughput: Spread
    median_ttft_ms: Spread
    p99_ttft_ms: Spread
    median_tpot_ms: Spread
    p99_itl_ms: Spread
    completed: int
    failed: int

    @classmethod
    def of(cls, engine: Engine, results: Sequence[BenchResult]) -> EngineSummary:
        return cls(
            engine=engine,
            runs=len(results),
            output_throughput=Spread.of([r.output_throughput for r in results]),
            median_ttft_ms=Spread.of([r.median_ttft_ms for r in results]),
            p99_ttft_ms=Spread.of([r.p99_ttft_ms for r in results]),
            median_tpot_ms=Spread.of([r.median_tpot_ms for r in results]),
            p99_itl_ms=Spread.of([r.p99_itl_ms for r in results]),
            completed=sum(r.completed for r in results),
            failed=sum(r.failed for r in results),
        )


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the FLOP count needs from a Llama-style ``config.json``."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ModelShape:
        def integer(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"config.json: {key!r} is {value!r}, not an integer")
            return value

        hidden = integer("hidden_size")
        heads = integer("num_attention_heads")
        head_dim = config.get("head_dim")
        return cls(
            hidden_size=hidden,
            num_hidden_layers=integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=integer("num_key_value_heads", heads),
            head_dim=head_dim if isinstance(head_dim, int) else hidden // heads,
            intermediate_size=integer("intermediate_size"),
            vocab_size=integer("vocab_size"),
        )

    @property
    def layer_params(self) -> int:
        """One decoder layer's linear weights: q, k, v, o and the gated MLP's three."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size
        return attention + 3 * self.hidden_size * self.intermediate_size

    @property
    def params_without_lm_head(self) -> int:
        return self.num_hidden_layers * self.layer_params

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params_with_lm_head(self) -> int:
        return self.params_without_lm_head + self.lm_head_params


def workload_flop(shape: ModelShape, prompt_tokens: int, output_tokens: int) -> float:
    """prompt tokens × 2 × params without the lm-head + output tokens × 2 × params with it."""
    return 2.0 * (
        prompt_tokens * shape.params_without_lm_head + output_tokens * shape.params_with_lm_head
    )


def ceiling_tok_s(flop: float, output_tokens: int, gflops: float) -> float:
    """Output tokens per second if every FLOP ran at the probe's rate and nothing else cost."""
    return output_tokens / (flop / (gflops * 1e9))


@dataclass(frozen=True, slots=True)
class Probe:
    """``bench.machine.matmul_gflops`` with the run's threads and dtype, before and after all
    runs."""

    before_gflops: float
    after_gflops: float

    @property
    def mean_gflops(self) -> float:
        return (self.before_gflops + self.after_gflops) / 2


@dataclass(frozen=True, slots=True)
class Roofline:
    prompt_tokens: int
    output_tokens: int
    flop: float
    ceiling_tok_s_before: float
    ceiling_tok_s_after: float
    ceiling_tok_s: float
    """At the mean of the two probes: what the fractions below are of."""
    vllm_fraction: float
    servedeck_fraction: float


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    num_prompts: int
    request_rate: float | None
    """Requests per second (Poisson arrivals); None for a burst (``--request-rate inf``)."""
    runs: int

    @property
    def rate_arg(self) -> str:
        return "inf" if self.request_rate is None else f"{self.request_rate:g}"


def workloads(
    bursts: int,
    burst: int,
    poisson_rates: Sequence[float],
    poisson_requests: int,
    poisson_runs: int,
) -> list[WorkloadSpec]:
    specs = [WorkloadSpec(f"burst-{burst}", burst, None, bursts)] if bursts > 0 else []
    for rate in poisson_rates:
        specs.append(WorkloadSpec(f"poisson-{rate:g}", poisson_requests, rate, poisson_runs))
    return specs


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    workload: WorkloadSpec
    vllm: EngineSummary
    servedeck: EngineSummary
    ratio: float
    """servedeck's median output tok/s over vLLM's."""
    roofline: Roofline


def summarize_workload(
    spec: WorkloadSpec,
    results: Mapping[Engine, Sequence[BenchResult]],
    shape: ModelShape,
    probe: Probe,
) -> WorkloadSummary:
    vllm = EngineSummary.of("vllm", results["vllm"])
    servedeck = EngineSummary.of("servedeck", results["servedeck"])
    every = [*results["vllm"], *results["servedeck"]]
    prompt_tokens = round(statistics.median(r.total_input_tokens for r in every))
    output_tokens = round(statistics.median(r.total_output_tokens for r in every))
    flop = workload_flop(shape, prompt_tokens, output_tokens)
    ceiling = ceiling_tok_s(flop, output_tokens, probe.mean_gflops)
    roofline = Roofline(
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        flop=flop,
        ceiling_tok_s_before=ceiling_tok_s(flop, output_tokens, probe.before_gflops),
        ceiling_tok_s_after=ceiling_tok_s(flop, output_tokens, probe.after_gflops),
        ceiling_tok_s=ceiling,
        vllm_fraction=vllm.output_throughput.median / ceiling,
        servedeck_fraction=servedeck.output_throughput.median / ceiling,
    )
    return WorkloadSummary(
        workload=spec,
        vllm=vllm,
        servedeck=servedeck,
        ratio=servedeck.output_throughput.median / vllm.output_throughput.median,
        roofline=roofline,
    )


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One server start and one client run against it."""

    workload: str
    engine: Engine
    index: int
    startup_s: float
    result_file: str
    """Relative to the summary's folder."""
    command: str
    """The client's exact command line."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run was made with, listed in the report."""

    model_dir: str
    servedeck_model: str
    dtype: str
    threads: int
    max_model_len: int
    input_len: int
    range_ratio: float
    output_len: int
    seed: int
    vllm_kvcache_space_gib: int
    vllm_omp_threads_bind: str
    vllm_serve: str
    servedeck_serve: str
    bench_serve: str
    peer_venv: str
    vllm_version: str
    peer_torch_version: str
    servedeck_commit: str


@dataclass(frozen=True, slots=True)
class Summary:
    settings: Settings
    shape: ModelShape
    probe: Probe
    load_average_start: list[float] | None
    load_average_end: list[float] | None
    workloads: list[WorkloadSummary]
    runs: list[RunRecord]

    def to_json(self) -> str:
        record = asdict(self)
        record["shape"] |= {
            "params_without_lm_head": self.shape.params_without_lm_head,
            "params_with_lm_head": self.shape.params_with_lm_head,
        }
        return json.dumps(record, indent=2) + "\n"


def _spread(spread: Spread, digits: int = 1) -> str:
    return f"{spread.median:.{digits}f} ({spread.low:.{digits}f}–{spread.high:.{digits}f})"


def _seconds(spread_ms: Spread) -> str:
    return f"{spread_ms.median / 1000:.2f} s"


def markdown(summary: Summary) -> str:
    s = summary.settings
    lines = [
        f"# servedeck against vLLM CPU {s.vllm_version}, {s.dtype}, {s.threads} threads",
        "",
        "Same model folder, same client (`vllm bench serve` from the peer venv), one server at "
        "a time, a fresh server per run, alternated vLLM, servedeck, vLLM, servedeck... per "
        "workload. Output tok/s: median (min–max) over the runs; latency columns: the median "
        "over the runs of each run's figure.",
        "",
        "| workload | engine | runs | output tok/s | ratio | TTFT p50 | TTFT p99 | TPOT p50 | "
        "ITL p99 | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in summary.workloads:
        for engine in (w.vllm, w.servedeck):
            ratio = f"**{w.ratio:.2f}**" if engine.engine == "servedeck" else ""
            cells = [
                w.workload.name,
                engine.engine,
                str(engine.runs),
                _spread(engine.output_throughput),
                ratio,
                _seconds(engine.median_ttft_ms),
                _seconds(engine.p99_ttft_ms),
                f"{engine.median_tpot_ms.median:.0f} ms",
                f"{engine.p99_itl_ms.median:.0f} ms",
                str(engine.failed),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    p = summary.probe
    shape = summary.shape
    lines += [
        "",
        "## Roofline",
        "",
        f"Matrix probe (`bench.machine.matmul_gflops`, {s.threads} threads, {s.dtype}): "
        f"{p.before_gflops:.1f} GFLOP/s before, {p.after_gflops:.1f} after. Weight products "
        f"only: {shape.params_without_lm_head / 1e6:.1f} M parameters per prompt token, "
        f"{shape.params_with_lm_head / 1e6:.1f} M with the lm-head per output token "
        "(2 FLOP each).",
        "",
        "| workload | prompt tokens | output tokens | TFLOP | ceiling output tok/s "
        "(before / after) | vLLM | servedeck |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in summary.workloads:
        r = w.roofline
        lines.append(
            f"| {w.workload.name} | {r.prompt_tokens} | {r.output_tokens} | "
            f"{r.flop / 1e12:.2f} | {r.ceiling_tok_s:.0f} ({r.ceiling_tok_s_before:.0f} / "
            f"{r.ceiling_tok_s_after:.0f}) | {r.vllm_fraction:.0%} | "
            f"{r.servedeck_fraction:.0%} |"
        )
    lines += [
        "",
        "## Settings",
        "",
        *(f"- {name}: `{value}`" for name, value in asdict(s).items()),
        f"- workloads: {', '.join(_workload_line(w.workload) for w in summary.workloads)}",
        f"- load average at start {summary.load_average_start}, at end {summary.load_average_end}",
        "",
        "## Runs",
        "",
        "| workload | engine | run | startup | result |",
        "|---|---|---|---|---|",
        *(
            f"| {r.workload} | {r.engine} | {r.index} | {r.startup_s:.0f} s | {r.result_file} |"
            for r in summary.runs
        ),
    ]
    return "\n".join(lines) + "\n"


def _workload_line(spec: WorkloadSpec) -> str:
    return f"{spec.name} ({spec.num_prompts} prompts at {spec.rate_arg} req/s, {spec.runs} runs)"
