"""Capacity search: the highest Poisson arrival rate a policy setting serves within an SLO.

DistServe's method on servedeck's own scheduler: for each policy and each setting of a small
grid (``max_num_seqs``, ``max_num_batched_tokens`` — continuous's and hybrid's step budget —,
their ``max_prefill_tokens`` — how much prefill a step takes beside decodes — and
``memory_reserve``), binary-search the
arrival rate; the simulator runs the real engine at each probe. Every probe replays the same
requests (same lengths, same exponential draws) with the gaps scaled by ``1 / rate``, so a
higher rate is the same trace, only denser, and the search is deterministic for a seed.

An SLO is per metric and percentile (``ttft_p99=0.5,tpot_p99=0.05``: the p99 of TTFT at most
0.5 s, and of TPOT at most 50 ms), or with ``attainment=0.9`` DistServe's reading: at least
90 % of requests meet every target. A request refused or never finished meets nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from engine.outputs import RequestMetrics
from engine.stats import percentile
from policies.continuous import DEFAULT_MAX_PREFILL_TOKENS
from policies.registry import POLICIES
from policies.spec import PolicySpec, parse_spec
from sim.cost_model import CostModel
from sim.simulator import SimResult, SimSetup, simulate
from sim.trace import ARTICLE_INPUT, ARTICLE_OUTPUT, TraceRequest, poisson_trace

V = TypeVar("V")

METRICS = ("ttft", "tpot", "e2e")
PADDED_POLICIES = ("static", "dynamic")
"""Policies whose group size is their own ``max_batch_size`` param (under the engine cap)."""


@dataclass(frozen=True, slots=True)
class Target:
    metric: str
    percentile: float
    seconds: float


@dataclass(frozen=True, slots=True)
class Slo:
    targets: tuple[Target, ...]
    attainment: float | None = None
    """None: each target's percentile must be within its bound. A fraction: that share of
    requests must meet every target at once (each target then bounds a single request)."""

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_p99=0.5,tpot_p99=50ms[,attainment=0.9]``; seconds unless suffixed ``ms``."""
        targets: list[Target] = []
        attainment = None
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"SLO term {part!r} is not key=value")
            key, value = key.strip(), value.strip()
            if key == "attainment":
                attainment = float(value.removesuffix("%")) / (100 if "%" in value else 1)
                if not 0 < attainment <= 1:
                    raise ValueError(f"attainment must be in (0, 1], got {value}")
                continue
            metric, _, pct = key.partition("_p")
            if metric not in METRICS or not pct.replace(".", "", 1).isdigit():
                raise ValueError(f"SLO key {key!r}: expected <{'|'.join(METRICS)}>_p<NN>")
            scale = 1e-3 if value.endswith("ms") else 1.0
            seconds = float(value.removesuffix("ms").removesuffix("s")) * scale
            if not 0 < float(pct) <= 100 or seconds <= 0:
                raise ValueError(f"SLO term {part!r} out of range")
            targets.append(Target(metric, float(pct), seconds))
        if not targets:
            raise ValueError("an SLO needs at least one target, e.g. ttft_p99=0.5")
        return cls(tuple(targets), attainment)

    def __str__(self) -> str:
        terms = [f"{t.metric}_p{t.percentile:g}={t.seconds * 1e3:g}ms" for t in self.targets]
        if self.attainment is not None:
            terms.append(f"attainment={self.attainment:g}")
        return ",".join(terms)


@dataclass(frozen=True, slots=True)
class Probe:
    """One simulated rate and what it gave."""

    rate: float
    meets: bool
    attained: float
    """Share of the trace's requests that met every target."""
    observed: dict[str, float | None]
    """Each target's percentile as observed (``ttft_p99`` -> seconds; None: no values)."""
    output_tok_s: float


def _value(record_metrics: RequestMetrics, metric: str) -> float | None:
    value: float | None = getattr(record_metrics, metric)  # a Target's metric is one of METRICS
    if metric == "tpot" and value is None and record_metrics.first_token_time is not None:
        return 0.0  # a single output token has no gap to wait for
    return value


def judge(result: SimResult, num_requests: int, slo: Slo, rate: float) -> Probe:
    """Whether ``result`` (of a ``num_requests`` trace) meets ``slo``. Requests missing from
    the records (refused, unfinished) count as missing every target."""
    missing = num_requests - len(result.records)
    observed: dict[str, float | None] = {}
    ok_percentiles = True
    for t in slo.targets:
        values = [_value(r.metrics, t.metric) for r in result.records]
        known = [v for v in values if v is not None] + [math.inf] * (
            missing + sum(v is None for v in values)
        )
        p = percentile(known, t.percentile)
        observed[f"{t.metric}_p{t.percentile:g}"] = p
        ok_percentiles &= p is not None and p <= t.seconds
    met = sum(
        all((v := _value(r.metrics, t.metric)) is not None and v <= t.seconds for t in slo.targets)
        for r in result.records
    )
    attained = met / num_requests if num_requests else 0.0
    meets = ok_percentiles if slo.attainment is None else attained >= slo.attainment
    out_tokens = sum(r.output_tokens for r in result.records)
    tok_s = out_tokens / result.duration_s if result.duration_s > 0 else 0.0
    return Probe(rate, meets, attained, observed, tok_s)


TraceAt = Callable[[float], Sequence[TraceRequest]]


def scaled(base: Sequence[TraceRequest], base_rate: float = 1.0) -> TraceAt:
    """The trace at any rate from one drawn at ``base_rate``: gaps scaled, lengths kept."""
    return lambda rate: [replace(r, arrived_at=r.arrived_at * base_rate / rate) for r in base]


def search_trace(
    recorded: Sequence[TraceRequest] | None = None, n: int = 500, seed: int = 0
) -> TraceAt:
    """What the search makes denser: a recorded trace's own lengths and gaps (its first ``n``
    requests; its mean rate taken as the base), or ``n`` Poisson arrivals with the article's
    lengths."""
    if recorded:
        recorded = sorted(recorded, key=lambda r: r.arrived_at)[:n]
        first = recorded[0].arrived_at
        base = [replace(r, arrived_at=r.arrived_at - first) for r in recorded]
        span = max(r.arrived_at for r in base)
        return scaled(base, (len(base) - 1) / span if span > 0 else 1.0)
    return scaled(poisson_trace(1.0, n, ARTICLE_INPUT, ARTICLE_OUTPUT, seed))


def max_rate(
    probe: Callable[[float], Probe],
    start: float = 1.0,
    rel_tol: float = 0.02,
    max_doublings: int = 20,
) -> tuple[Probe | None, list[Probe]]:
    """Highest rate whose probe meets, to ``rel_tol``: double (or halve) from ``start`` to
    bracket it, then bisect. Assumes meeting is monotone in rate, as it is for the same trace
    made denser. Returns the best passing probe (None if none passed) and every probe."""
    probes: list[Probe] = []

    def at(rate: float) -> Probe:
        probes.append(p := probe(rate))
        return p

    first = at(start)
    good: Probe | None = first if first.meets else None
    bad: Probe | None = None if first.meets else first
    for _ in range(max_doublings):
        if good is not None and bad is not None:
            break
        if good is not None:  # passing: go up
            p = at(good.rate * 2)
            good, bad = (p, bad) if p.meets else (good, p)
        else:  # failing: go down
            assert bad is not None
            p = at(bad.rate / 2)
            good, bad = (p, bad) if p.meets else (good, p)
    if good is None or bad is None:
        return good, probes
    while (bad.rate - good.rate) > rel_tol * good.rate:
        p = at(math.sqrt(good.rate * bad.rate))  # geometric midpoint: rates span decades
        good, bad = (p, bad) if p.meets else (good, p)
    return good, probes


def _parsed(text: str | None, parse: Callable[[str], V], default: tuple[V, ...]) -> tuple[V, ...]:
    """Comma-separated values, each through ``parse``; None or empty: ``default``."""
    if not text:
        return default
    return tuple(parse(v.strip()) for v in text.split(",") if v.strip())


def _int_or_none(text: str) -> int | None:
    return None if text in ("null", "none") else int(text)


@dataclass(frozen=True, slots=True)
class Grid:
    """The settings searched per policy; every combination is tried."""

    max_num_seqs: tuple[int, ...] = (64, 256)
    max_num_batched_tokens: tuple[int, ...] = (2048, 8192)
    memory_reserve: tuple[float, ...] = (0.0, 0.10)
    max_prefill_tokens: tuple[int | None, ...] = (DEFAULT_MAX_PREFILL_TOKENS,)
    """Tried only by the policies that have the param (None: the step budget only); a value
    above a setting's step budget is that budget."""

    @classmethod
    def of(
        cls,
        *,
        max_num_seqs: str | None = None,
        max_num_batched_tokens: str | None = None,
        memory_reserve: str | None = None,
        max_prefill_tokens: str | None = None,
    ) -> Grid:
        """From comma-separated values per field (``max_num_seqs="64,256"``; ``null`` for
        None in ``max_prefill_tokens``); a field given None or left out keeps its default."""
        grid = cls()
        return cls(
            max_num_seqs=_parsed(max_num_seqs, int, grid.max_num_seqs),
            max_num_batched_tokens=_parsed(
                max_num_batched_tokens, int, grid.max_num_batched_tokens
            ),
            memory_reserve=_parsed(memory_reserve, float, grid.memory_reserve),
            max_prefill_tokens=_parsed(max_prefill_tokens, _int_or_none, grid.max_prefill_tokens),
        )

    def settings(self, base: SimSetup) -> list[SimSetup]:
        combos = itertools.product(
            self.max_num_seqs, self.max_num_batched_tokens, self.memory_reserve
        )
        return [
            replace(base, max_num_seqs=s, max_num_batched_tokens=t, memory_reserve=m)
            for s, t, m in combos
        ]

    def policy_params(self, policy: str, setup: SimSetup) -> list[dict[str, Any]]:
        """The grid's own params for ``policy`` at ``setup``: one dict per prefill budget for
        the policies that have one (each at most the step budget, none twice), else one."""
        if "max_prefill_tokens" not in POLICIES[policy].params_model.model_fields:
            return [{}]
        cap = setup.max_num_batched_tokens
        budgets = dict.fromkeys(None if b is None else min(b, cap) for b in self.max_prefill_tokens)
        return [{"max_prefill_tokens": b} for b in budgets]


def spec_for(policy: str, setup: SimSetup, **extra: Any) -> PolicySpec:
    """The policy at the setting's caps: continuous and hybrid take them as their defaults;
    static and dynamic groups are as large as the engine cap allows. ``extra``: more params
    (the grid's prefill budget)."""
    params = {"max_batch_size": setup.max_num_seqs} if policy in PADDED_POLICIES else {}
    return parse_spec({"name": policy, "params": {**params, **extra}})


@dataclass(slots=True)
class Capacity:
    policy: str
    setup: SimSetup
    spec: PolicySpec
    best: Probe | None
    probes: list[Probe] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.best.rate if self.best else 0.0

    def setting(self) -> dict[str, Any]:
        return {
            "max_num_seqs": self.setup.max_num_seqs,
            "max_num_batched_tokens": self.setup.max_num_batched_tokens,
            "memory_reserve": self.setup.memory_reserve,
            **self.spec.params.model_dump(),
        }


@dataclass(slots=True)
class SearchResult:
    slo: Slo
    cost_model: str
    capacities: list[Capacity]

    def best(self, policy: str | None = None) -> Capacity | None:
        """The highest rate (ties: the earliest setting in the grid, so the smaller knobs)."""
        pool = [c for c in self.capacities if policy is None or c.policy == policy]
        return max(pool, key=lambda c: c.rate, default=None) if pool else None


def search(
    trace_at: TraceAt,
    cost_model: CostModel,
    policies: Sequence[str],
    slo: Slo,
    grid: Grid | None = None,
    base: SimSetup | None = None,
    start_rate: float = 1.0,
    rel_tol: float = 0.02,
) -> SearchResult:
    """For each policy and grid setting, the highest rate of ``trace_at(rate)`` within ``slo``."""
    base = base or SimSetup()
    capacities = []
    for policy in policies:
        grid = grid or Grid()
        for setup in grid.settings(base):
            for extra in grid.policy_params(policy, setup):
                spec = spec_for(policy, setup, **extra)

                def probe(rate: float, setup: SimSetup = setup, spec: PolicySpec = spec) -> Probe:
                    trace = trace_at(rate)
                    return judge(simulate(trace, cost_model, spec, setup), len(trace), slo, rate)

                best, probes = max_rate(probe, start_rate, rel_tol)
                capacities.append(Capacity(policy, setup, spec, best, probes))
    return SearchResult(slo, cost_model.name, capacities)


def _ms(value: float | None) -> str:
    return "-" if value is None else ("inf" if math.isinf(value) else f"{value * 1e3:.0f}")


def _prefill(spec: PolicySpec) -> str:
    """The prefill budget column: '-' for a policy without one, 'step' for null."""
    params = spec.params.model_dump()
    if "max_prefill_tokens" not in params:
        return "-"
    value = params["max_prefill_tokens"]
    return "step" if value is None else str(value)


def format_search(result: SearchResult) -> str:
    """The table of every setting and, per policy, the recommended one (a prediction)."""
    keys = [f"{t.metric}_p{t.percentile:g}" for t in result.slo.targets]
    lines = [
        f"capacity search: SLO {result.slo} on {result.cost_model} (predicted, not measured)",
        f"{'policy':<11}{'max_num_seqs':>13}{'batched_tok':>12}{'prefill':>8}{'reserve':>8}"
        f"{'rate/s':>9}{'out tok/s':>10}{'attained':>9}"
        + "".join(f"{k + ' ms':>13}" for k in keys),
    ]
    for c in result.capacities:
        b = c.best
        lines.append(
            f"{c.policy:<11}{c.setup.max_num_seqs:>13}{c.setup.max_num_batched_tokens:>12}"
            f"{_prefill(c.spec):>8}"
            f"{c.setup.memory_reserve:>8.2f}{c.rate:>9.3g}"
            f"{(b.output_tok_s if b else 0):>10.0f}{(b.attained if b else 0):>9.1%}"
            + "".join(f"{_ms(b.observed.get(k) if b else None):>13}" for k in keys)
        )
    lines.append("recommended:")
    for policy in dict.fromkeys(c.policy for c in result.capacities):
        best = result.best(policy)
        if best is None or best.best is None:
            lines.append(f"  {policy}: no rate meets the SLO")
            continue
        knobs = " ".join(f"{k}={v}" for k, v in best.setting().items())
        lines.append(f"  {policy}: {best.rate:.3g} req/s with {knobs}")
    return "\n".join(lines)
