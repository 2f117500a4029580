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

from bench.formatting import ms, pct, times
from bench.ratios import Run, divide, find, find_all

HOLDS = "holds"
SHAPE = "holds in shape only"
FAILS = "does not hold here"
MISSING = "not measured"

BAND = (0.8, 1.25)
"""A multiplicative claim "holds" when measured / claimed falls in this band."""
SHAPE_RATIO = 1.05
"""A multiplicative claim "holds in shape" when continuous wins by more than this."""
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


@dataclass(frozen=True, slots=True)
class Finding:
    """What a claim's rule found; ``fields`` fill measured parts of the claim's templates."""

    verdict: str
    figure: str
    why: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def missing(why: str = "runs missing", **fields: Any) -> Finding:
    return Finding(MISSING, "n/a", why, fields)


class Evidence:
    """The runs of one bench, and the burst sizes the claims are judged at."""

    def __init__(self, runs: list[Run], base: int, large: int | None) -> None:
        self.runs = runs
        self.base = base
        self.large = large

    def burst(self, policy: str, workload: str, concurrency: int | None = None) -> Run | None:
        return find(self.runs, suite="burst", policy=policy, workload=workload,
                    concurrency=concurrency or self.base)  # fmt: skip

    def throughput_ratio(self, concurrency: int | None) -> float | None:
        """Output tok/s of continuous over dynamic on the fixed-output burst."""
        cont = self.burst("continuous", "burst-fixed", concurrency)
        dyn = self.burst("dynamic", "burst-fixed", concurrency)
        if cont is None or dyn is None:
            return None
        return divide(cont["output_throughput"], dyn["output_throughput"])


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


def multiplier(claim: Claim, measured: float | None) -> Finding:
    """Continuous / other against the claimed factor (``multiplier_values``)."""
    lo, hi = claim["lo"], claim["hi"]
    if measured is None:
        return missing()
    figure = times(measured)
    if lo <= measured <= hi:
        return Finding(HOLDS, figure, "within the band")
    if measured > SHAPE_RATIO:
        side = "larger" if measured > hi else "smaller"
        why = f"continuous wins, but the gap is {side} than the claimed {claim['claimed']}×"
        return Finding(SHAPE, figure, why)
    return Finding(FAILS, figure, "continuous is not faster here")


def multiplier_values(claimed: float) -> dict[str, float]:
    return {"claimed": claimed, "lo": claimed * BAND[0], "hi": claimed * BAND[1],
            "shape": SHAPE_RATIO}  # fmt: skip


MULTIPLIER_THRESHOLD = "holds if {lo:.2f}× ≤ ratio ≤ {hi:.2f}×; in shape if ratio > {shape:.2f}×"


def _concurrency_gain(ev: Evidence, claim: Claim) -> Finding:
    return multiplier(claim, ev.throughput_ratio(ev.base))


def _gap_grows(ev: Evidence, claim: Claim) -> Finding:
    n = ev.large
    found = multiplier(claim, ev.throughput_ratio(n) if n else None)
    dyn = ev.burst("dynamic", "burst-fixed", n) if n else None
    if dyn is None:
        return found
    queue_share = divide(dyn.get("queue_time_p50"), dyn.get("e2e_p50"))
    figure = f"{found.figure}; dynamic's queue time is {pct(queue_share)} of its e2e p50"
    base_ratio = ev.throughput_ratio(ev.base)
    why = found.why
    if base_ratio is not None and found.verdict != MISSING:
        grows = (ev.throughput_ratio(n) or 0) > base_ratio
        why += f"; the gap {'grows' if grows else 'does not grow'} from {ev.base} to {n}"
    return Finding(found.verdict, figure, why)


def _lower_ttft(ev: Evidence, claim: Claim) -> Finding:
    pairs = []
    for n in [ev.base, ev.large]:
        for workload in ("burst-fixed", "burst-variable"):
            cont = ev.burst("continuous", workload, n) if n else None
            dyn = ev.burst("dynamic", workload, n) if n else None
            if cont and dyn:
                for q in ("ttft_p50", "ttft_p99"):
                    pairs.append((f"{workload}@{n} {q}", cont[q], dyn[q]))
    if not pairs:
        return missing()
    lower = [name for name, c, d in pairs if c < d]
    figure = "; ".join(f"{name}: {ms(c)} vs {ms(d)}" for name, c, d in pairs)
    if len(lower) == len(pairs):
        return Finding(HOLDS, figure, "lower everywhere")
    if lower:
        return Finding(SHAPE, figure, f"lower on {len(lower)} of {len(pairs)}")
    return Finding(FAILS, figure, "never lower")


def _kv_utilization(ev: Evidence, claim: Claim) -> Finding:
    cont = ev.burst("continuous", "burst-fixed")
    dyn = ev.burst("dynamic", "burst-fixed")
    stat = ev.burst("static", "burst-fixed")
    if cont is None or dyn is None:
        return missing()
    paged, padded = cont["kv_utilization"], dyn["kv_utilization"]
    figure = f"continuous {pct(paged)}, dynamic {pct(padded)}"
    if stat is not None:
        figure += f", static {pct(stat['kv_utilization'])}"
    if abs(paged - claim["paged"]) <= claim["paged_tol"] and (
        abs(padded - claim["padded"]) <= claim["padded_tol"]
    ):
        return Finding(HOLDS, figure, "both figures match")
    if paged - padded >= claim["gap"]:
        why = "paged is far better, at other figures (lengths and block size set them)"
        return Finding(SHAPE, figure, why)
    return Finding(FAILS, figure, "no clear gap")


def _capacity(ev: Evidence, claim: Claim) -> Finding:
    cont = find(ev.runs, suite="capacity", policy="continuous")
    stat = find(ev.runs, suite="capacity", policy="static")
    if not (cont and stat):
        return multiplier(claim, None)
    held = "mean_requests_holding_kv"
    found = multiplier(claim, divide(cont[held], stat[held]))
    figure = (
        f"{found.figure} (mean {cont[held]:.1f} vs {stat[held]:.1f}; peak "
        f"{cont['max_requests_holding_kv']} vs {stat['max_requests_holding_kv']})"
    )
    return Finding(found.verdict, figure, found.why)


def _batch_sweep(ev: Evidence, claim: Claim) -> Finding:
    sweep = {r["concurrency"]: r for r in find_all(ev.runs, suite="batch-sweep",
                                                   policy="continuous")}  # fmt: skip
    if len(sweep) < 3:
        return missing("sweep missing")
    sizes = sorted(sweep)
    low, high = sizes[0], sizes[-1]
    knee = int(claim["knee"])
    mid = knee if knee in sweep else sizes[len(sizes) // 2]
    t = {b: sweep[b]["output_throughput"] for b in sizes}
    f = {b: sweep[b]["ttft_p50"] for b in sizes}
    gain, growth = t[mid] / t[low], f[mid] / f[low]
    flat, climb = t[high] / t[mid], f[high] / f[mid]
    a, b, c = gain >= claim["gain"] * growth, flat <= claim["flat"], climb >= claim["climb"]
    figure = (
        f"{low}→{mid}: throughput {times(gain)}, TTFT {times(growth)}; "
        f"{mid}→{high}: throughput {times(flat)}, TTFT {times(climb)}"
    )
    checks = f"(a) {'yes' if a else 'no'}, (b) {'yes' if b else 'no'}, (c) {'yes' if c else 'no'}"
    if a and b and c:
        return Finding(HOLDS, figure, checks)
    return Finding(SHAPE if a and (b or c) else FAILS, figure, checks)


def _block_size(ev: Evidence, claim: Claim) -> Finding:
    def best(block_size: float) -> list[float]:
        runs = find_all(ev.runs, suite="block-sweep", policy="continuous",
                        block_size=int(block_size))  # fmt: skip
        return sorted((r["output_throughput"] for r in runs), reverse=True)

    small, large = best(claim["small"]), best(claim["large_block"])
    repeats = min(len(small), len(large)) or "n/a"
    if not small or not large:
        return missing(repeats=repeats)
    gain = large[0] / small[0] - 1
    runs = ", ".join(f"{t:.0f}" for t in small) + " vs " + ", ".join(f"{t:.0f}" for t in large)
    figure = f"{gain:+.1%} output tok/s ({runs} tok/s)"
    noise = max((r[0] - r[-1]) / r[0] for r in (small, large))
    if abs(gain) <= noise:
        why = f"no difference beyond run-to-run noise (repeats of one size differ by {noise:.0%})"
        return Finding(FAILS, figure, why, {"repeats": repeats})
    if claim["lo"] <= gain <= claim["hi"]:
        return Finding(HOLDS, figure, "within the band", {"repeats": repeats})
    if gain > claim["shape_lo"]:
        return Finding(SHAPE, figure, "faster, by another margin", {"repeats": repeats})
    slower = claim["noise_floor"]
    why = "no gain beyond run-to-run noise (a few %)" if gain > slower else "block 64 is slower"
    return Finding(FAILS, figure, why, {"repeats": repeats})


def _reserve(ev: Evidence, claim: Claim) -> Finding:
    runs = {r["memory_reserve"]: r for r in find_all(ev.runs, suite="reserve")}
    reserve, high = claim["reserve"], claim["high_reserve"]
    if not {0.0, reserve} <= set(runs):
        return missing()

    def failures(r: Run) -> int:
        return r["preemptions"] + r["refused"]

    figure = "; ".join(
        f"reserve {k:.2f}: {failures(r)} ({r['preemptions']} preempted, {r['refused']} "
        f"refused), {r['output_throughput']:.0f} tok/s"
        for k, r in sorted(runs.items())
    )
    f0, f10 = failures(runs[0.0]), failures(runs[reserve])
    f15 = failures(runs[high]) if high in runs else f10
    if f0 == 0:
        why = "no preemption or refusal even without a reserve: nothing to cut at this load"
        return Finding(FAILS, figure, why)
    if f10 <= f0 * claim["cut"] and f15 <= f10:
        return Finding(HOLDS, figure, "the reserve cuts them")
    if f10 < f0:
        return Finding(SHAPE, figure, "fewer, but not halved")
    return Finding(FAILS, figure, "the reserve does not cut them")


def _shallow_queue(ev: Evidence, claim: Claim) -> Finding:
    depths = sorted({r["concurrency"] for r in find_all(ev.runs, suite="hybrid-depth")})
    pairs = []
    for d in depths:
        h = find(ev.runs, suite="hybrid-depth", policy="hybrid", concurrency=d)
        c = find(ev.runs, suite="hybrid-depth", policy="continuous", concurrency=d)
        if h and c:
            pairs.append((d, h, c))
    deeper = [(h, c) for d, h, c in pairs if d >= claim["min_depth"]]
    if not deeper:
        return missing()
    figure = "; ".join(
        f"depth {d}: TTFT {ms(h['ttft_p50'])} vs {ms(c['ttft_p50'])}, "
        f"TPOT {ms(h['tpot_p50'])} vs {ms(c['tpot_p50'])}"
        for d, h, c in pairs
    )
    wins = sum(1 for h, c in deeper if h["ttft_p50"] < c["ttft_p50"])
    if wins == len(deeper):
        return Finding(HOLDS, figure, "lower at every depth")
    if wins:
        return Finding(SHAPE, figure, f"lower at {wins} depths")
    return Finding(FAILS, figure, "requests queue behind the one running, so their TTFT grows")


def _bookkeeping(ev: Evidence, claim: Claim) -> Finding:
    cap = find(ev.runs, suite="capacity", policy="continuous")
    cont = ev.burst("continuous", "burst-fixed")
    if cap is None or cont is None or not cap.get("kv_bytes_held_at_peak"):
        return missing()
    meta = cap["bookkeeping_bytes"] / cap["kv_bytes_held_at_peak"]
    empty = 1 - cont["kv_utilization"]
    total = meta + empty
    figure = f"{pct(total)} (metadata {pct(meta)}, partly filled blocks {pct(empty)})"
    if claim["lo"] <= total <= claim["hi"]:
        return Finding(HOLDS, figure, "in the band")
    if total < claim["lo"]:
        why = "cheaper than claimed; the metadata lives in host memory, not with the KV"
        return Finding(SHAPE, figure, why)
    return Finding(FAILS, figure, "costs more than claimed")


def _reclaim(ev: Evidence, claim: Claim) -> Finding:
    runs = find_all(ev.runs, suite="reclaim")
    swept = next((r for r in runs if r.get("reclaim_every_s")), None)
    plain = next((r for r in runs if not r.get("reclaim_every_s")), None)
    if swept is None or plain is None:
        return missing()
    cost = swept.get("reclaim_cpu_share") or 0.0
    with_sweep = swept.get("kv_utilization_effective")
    without = plain.get("kv_utilization_effective")
    figure = (
        f"sweep every {swept['reclaim_every_s']:g} s: {swept.get('reclaims', 0)} sweeps, "
        f"{pct(cost)} of run time; effective KV utilization {pct(with_sweep)} vs "
        f"{pct(without)} without; {swept['output_throughput']:.0f} vs "
        f"{plain['output_throughput']:.0f} tok/s"
    )
    lifted = with_sweep is not None and without is not None and with_sweep > without
    if not lifted:
        return Finding(FAILS, figure, "no lift")
    if cost < claim["cheap"]:
        return Finding(SHAPE, figure, "lifts utilization, and costs far less than claimed")
    if cost <= claim["max_cost"]:
        return Finding(HOLDS, figure, "lift at that cost")
    return Finding(FAILS, figure, "costs more than claimed")


CLAIMS: tuple[Claim, ...] = (
    Claim(
        1,
        "Continuous batching gives {claimed:g}× dynamic batching's throughput at {base} "
        "concurrent requests",
        "burst-fixed@{base}: output tok/s, continuous / dynamic",
        MULTIPLIER_THRESHOLD,
        _concurrency_gain,
        multiplier_values(1.5),
    ),
    Claim(
        2,
        "{claimed:g}× at {large} concurrent, dynamic limited by queueing",
        "burst-fixed@{large}: output tok/s, continuous / dynamic",
        MULTIPLIER_THRESHOLD,
        _gap_grows,
        multiplier_values(2.6),
    ),
    Claim(
        3,
        "Continuous batching lowers TTFT p50 and p99",
        "bursts: TTFT continuous vs dynamic",
        "holds if continuous is lower on both at every burst size; in shape if on some",
        _lower_ttft,
    ),
    Claim(
        4,
        "Paged KV utilization about {paged_pct} % vs about {padded_pct} % for padded allocation",
        "burst-fixed@{base}: time-averaged KV utilization",
        "holds if paged is within {paged_tol_pct} points of {paged_pct} % and padded within "
        "{padded_tol_pct} points of {padded_pct} %; in shape if paged exceeds padded by "
        "{gap_pct} points or more",
        _kv_utilization,
        {"paged": 0.964, "padded": 0.72, "paged_tol": 0.03, "padded_tol": 0.08, "gap": 0.10},
    ),
    Claim(
        5,
        "About {claimed:g}× more concurrent requests at the same KV memory",
        "capacity runs (one pool well below the burst's demand): mean requests holding KV, "
        "continuous / static",
        MULTIPLIER_THRESHOLD,
        _capacity,
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
        _batch_sweep,
        {"knee": 32, "gain": 2, "flat": 1.25, "climb": 1.25},
    ),
    Claim(
        7,
        "Block size {small:g}→{large_block:g} gives about +{claimed_pct} % throughput",
        "burst-fixed@{base}, continuous, block {small:g} vs {large_block:g}, best of {repeats} "
        "interleaved runs each",
        "holds if +{lo_pct} % to +{hi_pct} %; in shape if +{shape_lo_pct} % to +{lo_pct} % or "
        "above +{hi_pct} %; a gain smaller than the spread between repeats of one size is noise",
        _block_size,
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
        _reserve,
        {"reserve": 0.10, "high_reserve": 0.15, "cut": 0.5},
    ),
    Claim(
        9,
        "Below queue depth {depth:g}, running requests one at a time lowers TTFT",
        "closed loop of 1–3 clients: TTFT p50 (and TPOT p50), hybrid vs continuous",
        "holds if hybrid's TTFT p50 is lower than continuous's at every depth ≥ {min_depth:g}",
        _shallow_queue,
        {"depth": 4, "min_depth": 2},
    ),
    Claim(
        10,
        "The paged KV bookkeeping costs {lo_pct}–{hi_pct} % of memory",
        "capacity run (metadata at peak) and burst-fixed (utilization), continuous",
        "cost = block-manager metadata bytes / KV bytes held (at peak) + slots held but empty "
        "(1 − KV utilization); holds if {lo_pct}–{hi_pct} %, in shape if below {lo_pct} %",
        _bookkeeping,
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
        _reclaim,
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
