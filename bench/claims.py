"""The article's eleven claims: one registry, each claim judged from the measured runs.

``CLAIMS`` holds, per claim, its number, its text, what is measured, the threshold and the
function that gives the verdict; the article's figures and the thresholds are named once in the
claim's ``values`` and both the text and the verdict read them from there (``<name>_pct`` is a
fraction written as a percentage). Every verdict is computed from the numbers of one bench run;
nothing is hard-coded. A claim whose runs are missing is "not measured".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import claim_rules as rules
from bench.evidence import BAND, SHAPE_RATIO, Evidence, Finding
from bench.ratios import Run

ARTICLE_LARGE = 500
"""The article's larger burst, named by claim 2 when a run has no second burst size."""


@dataclass(frozen=True, slots=True)
class Verdict:
    number: int
    claim: str
    measurement: str
    figure: str
    threshold: str
    verdict: str
    why: str


Rule = Callable[[Evidence, "Claim"], Finding]


@dataclass(frozen=True, slots=True)
class Claim:
    number: int
    text: str
    measurement: str
    threshold: str
    rule: Rule
    values: Mapping[str, float] = field(default_factory=dict)
    """The article's figures and the thresholds, by name; the templates may name each one,
    ``<name>_pct`` (as a percentage), ``base`` and ``large``."""

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    def judge(self, evidence: Evidence) -> Verdict:
        found = self.rule(evidence, self)
        fields: dict[str, Any] = {"base": evidence.base, "large": evidence.large or ARTICLE_LARGE}
        for name, value in self.values.items():
            fields[name] = value
            fields[f"{name}_pct"] = f"{value * 100:g}"
        fields |= found.fields
        return Verdict(
            self.number,
            self.text.format(**fields),
            self.measurement.format(**fields),
            found.figure,
            self.threshold.format(**fields),
            found.verdict,
            found.why,
        )


def multiplier_values(claimed: float) -> dict[str, float]:
    """A multiplicative claim's values: the claimed factor and the band around it."""
    return {"claimed": claimed, "lo": claimed * BAND[0], "hi": claimed * BAND[1],
            "shape": SHAPE_RATIO}  # fmt: skip


MULTIPLIER_THRESHOLD = "holds if {lo:.2f}× ≤ ratio ≤ {hi:.2f}×; in shape if ratio > {shape:.2f}×"


CLAIMS: tuple[Claim, ...] = (
    Claim(
        1,
        "Continuous batching gives {claimed:g}× dynamic batching's throughput at {base} "
        "concurrent requests",
        "burst-fixed@{base}: output tok/s, continuous / dynamic",
        MULTIPLIER_THRESHOLD,
        rules.concurrency_gain,
        multiplier_values(1.5),
    ),
    Claim(
        2,
        "{claimed:g}× at {large} concurrent, dynamic limited by queueing",
        "burst-fixed@{large}: output tok/s, continuous / dynamic",
        MULTIPLIER_THRESHOLD,
        rules.gap_grows,
        multiplier_values(2.6),
    ),
    Claim(
        3,
        "Continuous batching lowers TTFT p50 and p99",
        "bursts: TTFT continuous vs dynamic",
        "holds if continuous is lower on both at every burst size; in shape if on some",
        rules.lower_ttft,
    ),
    Claim(
        4,
        "Paged KV utilization about {paged_pct} % vs about {padded_pct} % for padded allocation",
        "burst-fixed@{base}: time-averaged KV utilization",
        "holds if paged is within {paged_tol_pct} points of {paged_pct} % and padded within "
        "{padded_tol_pct} points of {padded_pct} %; in shape if paged exceeds padded by "
        "{gap_pct} points or more",
        rules.kv_utilization,
        {"paged": 0.964, "padded": 0.72, "paged_tol": 0.03, "padded_tol": 0.08, "gap": 0.10},
    ),
    Claim(
        5,
        "About {claimed:g}× more concurrent requests at the same KV memory",
        "capacity runs (one pool well below the burst's demand): mean requests holding KV, "
        "continuous / static",
        MULTIPLIER_THRESHOLD,
        rules.capacity,
        multiplier_values(2.3),
    ),
    Claim(
        6,
        "Batch 1→{knee:g} multiplies throughput far more than TTFT; past {knee:g} throughput "
        "flattens while latency climbs",
        "batch-size sweep (closed loop, B clients, max batch B), continuous",
        "(a) throughput gain 1→{knee:g} ≥ {gain:g} × TTFT p50 growth; (b) throughput "
        "{knee:g}→largest ≤ {flat:g}×; (c) TTFT p50 {knee:g}→largest ≥ {climb:g}×. Holds if all "
        "three; in shape if (a) and one more",
        rules.batch_sweep,
        {"knee": 32, "gain": 2, "flat": 1.25, "climb": 1.25},
    ),
    Claim(
        7,
        "Block size {small:g}→{large_block:g} gives about +{claimed_pct} % throughput",
        "burst-fixed@{base}, continuous, block {small:g} vs {large_block:g}, best of {repeats} "
        "interleaved runs each",
        "holds if +{lo_pct} % to +{hi_pct} %; in shape if +{shape_lo_pct} % to +{lo_pct} % or "
        "above +{hi_pct} %; a gain smaller than the spread between repeats of one size is noise",
        rules.block_size,
        {
            "small": 16,
            "large_block": 64,
            "claimed": 0.08,
            "lo": 0.04,
            "hi": 0.16,
            "shape_lo": 0.01,
            "noise_floor": -0.03,
        },
    ),
    Claim(
        8,
        "A {reserve_pct}–{high_reserve_pct} % memory reserve cuts out-of-memory failures (here: "
        "preemptions and refused requests under overload)",
        "burst of long-output requests on a pool well below its demand, continuous, reserve "
        "0/{reserve:.2f}/{high_reserve:.2f}",
        "holds if failures at {reserve:.2f} ≤ half of those at 0 and {high_reserve:.2f} ≤ "
        "{reserve:.2f}; in shape if fewer at {reserve:.2f} than at 0",
        rules.reserve,
        {"reserve": 0.10, "high_reserve": 0.15, "cut": 0.5},
    ),
    Claim(
        9,
        "Below queue depth {depth:g}, running requests one at a time lowers TTFT",
        "closed loop of 1–3 clients: TTFT p50 (and TPOT p50), hybrid vs continuous",
        "holds if hybrid's TTFT p50 is lower than continuous's at every depth ≥ {min_depth:g}",
        rules.shallow_queue,
        {"depth": 4, "min_depth": 2},
    ),
    Claim(
        10,
        "The paged KV bookkeeping costs {lo_pct}–{hi_pct} % of memory",
        "capacity run (metadata at peak) and burst-fixed (utilization), continuous",
        "cost = block-manager metadata bytes / KV bytes held (at peak) + slots held but empty "
        "(1 − KV utilization); holds if {lo_pct}–{hi_pct} %, in shape if below {lo_pct} %",
        rules.bookkeeping,
        {"lo": 0.05, "hi": 0.10},
    ),
    Claim(
        11,
        "A {every_s:g}-second reclaim sweep costs {cpu_lo_pct}–{cpu_hi_pct} % CPU and keeps "
        "utilization high when blocks leak",
        "burst-variable with some requests leaked halfway (reclaim table), continuous",
        "holds if the sweep costs ≤ {max_cost_pct} % of the run's time and lifts effective KV "
        "utilization (leaked tokens not counted) above the run without sweeps; in shape if it "
        "lifts it at a cost under {cheap_pct} %",
        rules.reclaim,
        {"every_s": 5, "cpu_lo": 0.02, "cpu_hi": 0.03, "max_cost": 0.05, "cheap": 0.01},
    ),
)
CLAIMS_BY_NUMBER: dict[int, Claim] = {c.number: c for c in CLAIMS}


def judge_claim(number: int, runs: list[Run], base: int, large: int | None) -> Verdict:
    return CLAIMS_BY_NUMBER[number].judge(Evidence(runs, base, large))


def verdicts(runs: list[Run], base: int, large: int | None) -> list[Verdict]:
    evidence = Evidence(runs, base, large)
    return [claim.judge(evidence) for claim in CLAIMS]


def judge(runs: list[Run], base: int, large: int | None) -> list[dict[str, Any]]:
    return [asdict(v) for v in verdicts(runs, base, large)]
