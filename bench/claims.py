"""The article's eleven claims, each judged from the measured runs.

Every verdict is computed here from the numbers of one bench run against the threshold
written next to it; nothing is hard-coded. A claim whose runs are missing is "not measured".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.formatting import ms, pct, times
from bench.ratios import Run, divide, find, find_all

HOLDS = "holds"
SHAPE = "holds in shape only"
FAILS = "does not hold here"
MISSING = "not measured"

BAND = (0.8, 1.25)
"""A multiplicative claim "holds" when measured / claimed falls in this band."""


@dataclass(frozen=True, slots=True)
class Verdict:
    number: int
    claim: str
    measurement: str
    figure: str
    threshold: str
    verdict: str
    why: str


class Judge:
    def __init__(self, runs: list[Run], base: int, large: int | None) -> None:
        self.runs = runs
        self.base = base
        self.large = large

    def burst(self, policy: str, workload: str, concurrency: int | None = None) -> Run | None:
        return find(
            self.runs,
            suite="burst",
            policy=policy,
            workload=workload,
            concurrency=concurrency or self.base,
        )

    def all(self) -> list[Verdict]:
        claims: list[Callable[[], Verdict]] = [
            self.c1,
            self.c2,
            self.c3,
            self.c4,
            self.c5,
            self.c6,
            self.c7,
            self.c8,
            self.c9,
            self.c10,
            self.c11,
        ]
        return [claim() for claim in claims]

    # -- helpers ---------------------------------------------------------------------------

    def _multiplier(
        self, number: int, claim: str, measured: float | None, claimed: float, measurement: str
    ) -> Verdict:
        lo, hi = claimed * BAND[0], claimed * BAND[1]
        threshold = f"holds if {lo:.2f}× ≤ ratio ≤ {hi:.2f}×; in shape if ratio > 1.05×"
        if measured is None:
            return Verdict(number, claim, measurement, "n/a", threshold, MISSING, "runs missing")
        figure = times(measured)
        if lo <= measured <= hi:
            return Verdict(number, claim, measurement, figure, threshold, HOLDS, "within the band")
        if measured > 1.05:
            side = "larger" if measured > hi else "smaller"
            why = f"continuous wins, but the gap is {side} than the claimed {claimed}×"
            return Verdict(number, claim, measurement, figure, threshold, SHAPE, why)
        why = "continuous is not faster here"
        return Verdict(number, claim, measurement, figure, threshold, FAILS, why)

    def _throughput_ratio(self, concurrency: int | None) -> float | None:
        cont = self.burst("continuous", "burst-fixed", concurrency)
        dyn = self.burst("dynamic", "burst-fixed", concurrency)
        if cont is None or dyn is None:
            return None
        return divide(cont["output_throughput"], dyn["output_throughput"])

    # -- the claims ------------------------------------------------------------------------

    def c1(self) -> Verdict:
        return self._multiplier(
            1,
            f"Continuous batching gives 1.5× dynamic batching's throughput at {self.base} "
            "concurrent requests",
            self._throughput_ratio(self.base),
            1.5,
            f"burst-fixed@{self.base}: output tok/s, continuous / dynamic",
        )

    def c2(self) -> Verdict:
        n = self.large
        claim = f"2.6× at {n or 500} concurrent, dynamic limited by queueing"
        verdict = self._multiplier(
            2,
            claim,
            self._throughput_ratio(n) if n else None,
            2.6,
            f"burst-fixed@{n}: output tok/s, continuous / dynamic",
        )
        dyn = self.burst("dynamic", "burst-fixed", n) if n else None
        if dyn is None:
            return verdict
        queue_share = divide(dyn.get("queue_time_p50"), dyn.get("e2e_p50"))
        figure = f"{verdict.figure}; dynamic's queue time is {pct(queue_share)} of its e2e p50"
        base_ratio = self._throughput_ratio(self.base)
        why = verdict.why
        if base_ratio is not None and verdict.verdict != MISSING:
            grows = (self._throughput_ratio(n) or 0) > base_ratio
            why += f"; the gap {'grows' if grows else 'does not grow'} from {self.base} to {n}"
        return Verdict(
            2, claim, verdict.measurement, figure, verdict.threshold, verdict.verdict, why
        )

    def c3(self) -> Verdict:
        claim = "Continuous batching lowers TTFT p50 and p99"
        threshold = "holds if continuous is lower on both at every burst size; in shape if on some"
        pairs = []
        for n in [self.base, self.large]:
            for workload in ("burst-fixed", "burst-variable"):
                cont = self.burst("continuous", workload, n) if n else None
                dyn = self.burst("dynamic", workload, n) if n else None
                if cont and dyn:
                    for q in ("ttft_p50", "ttft_p99"):
                        pairs.append((f"{workload}@{n} {q}", cont[q], dyn[q]))
        measurement = "bursts: TTFT continuous vs dynamic"
        if not pairs:
            return Verdict(3, claim, measurement, "n/a", threshold, MISSING, "runs missing")
        lower = [name for name, c, d in pairs if c < d]
        figure = "; ".join(f"{name}: {ms(c)} vs {ms(d)}" for name, c, d in pairs)
        if len(lower) == len(pairs):
            return Verdict(3, claim, measurement, figure, threshold, HOLDS, "lower everywhere")
        if lower:
            why = f"lower on {len(lower)} of {len(pairs)}"
            return Verdict(3, claim, measurement, figure, threshold, SHAPE, why)
        return Verdict(3, claim, measurement, figure, threshold, FAILS, "never lower")

    def c4(self) -> Verdict:
        claim = "Paged KV utilization about 96.4 % vs about 72 % for padded allocation"
        threshold = (
            "holds if paged is within 3 points of 96.4 % and padded within 8 points of 72 %; "
            "in shape if paged exceeds padded by 10 points or more"
        )
        cont = self.burst("continuous", "burst-fixed")
        dyn = self.burst("dynamic", "burst-fixed")
        stat = self.burst("static", "burst-fixed")
        measurement = f"burst-fixed@{self.base}: time-averaged KV utilization"
        if cont is None or dyn is None:
            return Verdict(4, claim, measurement, "n/a", threshold, MISSING, "runs missing")
        paged, padded = cont["kv_utilization"], dyn["kv_utilization"]
        figure = f"continuous {pct(paged)}, dynamic {pct(padded)}"
        if stat is not None:
            figure += f", static {pct(stat['kv_utilization'])}"
        if abs(paged - 0.964) <= 0.03 and abs(padded - 0.72) <= 0.08:
            return Verdict(4, claim, measurement, figure, threshold, HOLDS, "both figures match")
        if paged - padded >= 0.10:
            why = "paged is far better, at other figures (lengths and block size set them)"
            return Verdict(4, claim, measurement, figure, threshold, SHAPE, why)
        return Verdict(4, claim, measurement, figure, threshold, FAILS, "no clear gap")

    def c5(self) -> Verdict:
        cont = find(self.runs, suite="capacity", policy="continuous")
        stat = find(self.runs, suite="capacity", policy="static")
        ratio = None
        if cont and stat:
            ratio = divide(cont["mean_requests_holding_kv"], stat["mean_requests_holding_kv"])
        verdict = self._multiplier(
            5,
            "About 2.3× more concurrent requests at the same KV memory",
            ratio,
            2.3,
            "capacity runs (one pool well below the burst's demand): mean requests holding KV, "
            "continuous / static",
        )
        if cont and stat:
            figure = (
                f"{verdict.figure} (mean {cont['mean_requests_holding_kv']:.1f} vs "
                f"{stat['mean_requests_holding_kv']:.1f}; peak {cont['max_requests_holding_kv']} "
                f"vs {stat['max_requests_holding_kv']})"
            )
            verdict = Verdict(5, verdict.claim, verdict.measurement, figure, verdict.threshold,
                              verdict.verdict, verdict.why)  # fmt: skip
        return verdict

    def c6(self) -> Verdict:
        claim = (
            "Batch 1→32 multiplies throughput far more than TTFT; past 32 throughput flattens "
            "while latency climbs"
        )
        threshold = (
            "(a) throughput gain 1→32 ≥ 2 × TTFT p50 growth; (b) throughput 32→largest ≤ 1.25×; "
            "(c) TTFT p50 32→largest ≥ 1.25×. Holds if all three; in shape if (a) and one more"
        )
        sweep = {r["concurrency"]: r for r in find_all(self.runs, suite="batch-sweep",
                                                       policy="continuous")}  # fmt: skip
        measurement = "batch-size sweep (closed loop, B clients, max batch B), continuous"
        if len(sweep) < 3:
            return Verdict(6, claim, measurement, "n/a", threshold, MISSING, "sweep missing")
        sizes = sorted(sweep)
        low, high = sizes[0], sizes[-1]
        mid = 32 if 32 in sweep else sizes[len(sizes) // 2]
        t = {b: sweep[b]["output_throughput"] for b in sizes}
        f = {b: sweep[b]["ttft_p50"] for b in sizes}
        gain, growth = t[mid] / t[low], f[mid] / f[low]
        flat, climb = t[high] / t[mid], f[high] / f[mid]
        a, b, c = gain >= 2 * growth, flat <= 1.25, climb >= 1.25
        figure = (
            f"{low}→{mid}: throughput {times(gain)}, TTFT {times(growth)}; "
            f"{mid}→{high}: throughput {times(flat)}, TTFT {times(climb)}"
        )
        checks = (
            f"(a) {'yes' if a else 'no'}, (b) {'yes' if b else 'no'}, (c) {'yes' if c else 'no'}"
        )
        if a and b and c:
            return Verdict(6, claim, measurement, figure, threshold, HOLDS, checks)
        if a and (b or c):
            return Verdict(6, claim, measurement, figure, threshold, SHAPE, checks)
        return Verdict(6, claim, measurement, figure, threshold, FAILS, checks)

    def c7(self) -> Verdict:
        claim = "Block size 16→64 gives about +8 % throughput"
        threshold = (
            "holds if +4 % to +16 %; in shape if +1 % to +4 % or above +16 %; a gain smaller "
            "than the spread between repeats of one size is noise"
        )

        def best(block_size: int) -> list[float]:
            runs = find_all(self.runs, suite="block-sweep", policy="continuous",
                            block_size=block_size)  # fmt: skip
            return sorted((r["output_throughput"] for r in runs), reverse=True)

        small, large = best(16), best(64)
        measurement = (
            f"burst-fixed@{self.base}, continuous, block 16 vs 64, best of "
            f"{min(len(small), len(large)) or 'n/a'} interleaved runs each"
        )
        if not small or not large:
            return Verdict(7, claim, measurement, "n/a", threshold, MISSING, "runs missing")
        gain = large[0] / small[0] - 1
        runs = ", ".join(f"{t:.0f}" for t in small) + " vs " + ", ".join(f"{t:.0f}" for t in large)
        figure = f"{gain:+.1%} output tok/s ({runs} tok/s)"
        noise = max((r[0] - r[-1]) / r[0] for r in (small, large))
        if abs(gain) <= noise:
            why = (
                f"no difference beyond run-to-run noise (repeats of one size differ by {noise:.0%})"
            )
            return Verdict(7, claim, measurement, figure, threshold, FAILS, why)
        if 0.04 <= gain <= 0.16:
            return Verdict(7, claim, measurement, figure, threshold, HOLDS, "within the band")
        if gain > 0.01:
            return Verdict(
                7, claim, measurement, figure, threshold, SHAPE, "faster, by another margin"
            )
        why = "no gain beyond run-to-run noise (a few %)" if gain > -0.03 else "block 64 is slower"
        return Verdict(7, claim, measurement, figure, threshold, FAILS, why)

    def c8(self) -> Verdict:
        claim = (
            "A 10–15 % memory reserve cuts out-of-memory failures (here: preemptions and refused "
            "requests under overload)"
        )
        threshold = (
            "holds if failures at 0.10 ≤ half of those at 0 and 0.15 ≤ 0.10; "
            "in shape if fewer at 0.10 than at 0"
        )
        runs = {r["memory_reserve"]: r for r in find_all(self.runs, suite="reserve")}
        measurement = (
            "burst of long-output requests on a pool well below its demand, continuous, "
            "reserve 0/0.10/0.15"
        )
        if not {0.0, 0.10} <= set(runs):
            return Verdict(8, claim, measurement, "n/a", threshold, MISSING, "runs missing")

        def failures(r: Run) -> int:
            return r["preemptions"] + r["refused"]

        figure = "; ".join(
            f"reserve {k:.2f}: {failures(r)} ({r['preemptions']} preempted, {r['refused']} "
            f"refused), {r['output_throughput']:.0f} tok/s"
            for k, r in sorted(runs.items())
        )
        f0, f10 = failures(runs[0.0]), failures(runs[0.10])
        f15 = failures(runs[0.15]) if 0.15 in runs else f10
        if f0 == 0:
            why = "no preemption or refusal even without a reserve: nothing to cut at this load"
            return Verdict(8, claim, measurement, figure, threshold, FAILS, why)
        if f10 <= f0 / 2 and f15 <= f10:
            return Verdict(8, claim, measurement, figure, threshold, HOLDS, "the reserve cuts them")
        if f10 < f0:
            return Verdict(8, claim, measurement, figure, threshold, SHAPE, "fewer, but not halved")
        return Verdict(
            8, claim, measurement, figure, threshold, FAILS, "the reserve does not cut them"
        )

    def c9(self) -> Verdict:
        claim = "Below queue depth 4, running requests one at a time lowers TTFT"
        threshold = "holds if hybrid's TTFT p50 is lower than continuous's at every depth ≥ 2"
        depths = sorted({r["concurrency"] for r in find_all(self.runs, suite="hybrid-depth")})
        measurement = "closed loop of 1–3 clients: TTFT p50 (and TPOT p50), hybrid vs continuous"
        pairs = []
        for d in depths:
            h = find(self.runs, suite="hybrid-depth", policy="hybrid", concurrency=d)
            c = find(self.runs, suite="hybrid-depth", policy="continuous", concurrency=d)
            if h and c:
                pairs.append((d, h, c))
        if not [p for p in pairs if p[0] >= 2]:
            return Verdict(9, claim, measurement, "n/a", threshold, MISSING, "runs missing")
        figure = "; ".join(
            f"depth {d}: TTFT {ms(h['ttft_p50'])} vs {ms(c['ttft_p50'])}, "
            f"TPOT {ms(h['tpot_p50'])} vs {ms(c['tpot_p50'])}"
            for d, h, c in pairs
        )
        deeper = [(h, c) for d, h, c in pairs if d >= 2]
        wins = sum(1 for h, c in deeper if h["ttft_p50"] < c["ttft_p50"])
        if wins == len(deeper):
            return Verdict(9, claim, measurement, figure, threshold, HOLDS, "lower at every depth")
        if wins:
            return Verdict(
                9, claim, measurement, figure, threshold, SHAPE, f"lower at {wins} depths"
            )
        why = "requests queue behind the one running, so their TTFT grows"
        return Verdict(9, claim, measurement, figure, threshold, FAILS, why)

    def c10(self) -> Verdict:
        claim = "The paged KV bookkeeping costs 5–10 % of memory"
        threshold = (
            "cost = block-manager metadata bytes / KV bytes held (at peak) + slots held but "
            "empty (1 − KV utilization); holds if 5–10 %, in shape if below 5 %"
        )
        cap = find(self.runs, suite="capacity", policy="continuous")
        cont = self.burst("continuous", "burst-fixed")
        measurement = "capacity run (metadata at peak) and burst-fixed (utilization), continuous"
        if cap is None or cont is None or not cap.get("kv_bytes_held_at_peak"):
            return Verdict(10, claim, measurement, "n/a", threshold, MISSING, "runs missing")
        meta = cap["bookkeeping_bytes"] / cap["kv_bytes_held_at_peak"]
        empty = 1 - cont["kv_utilization"]
        total = meta + empty
        figure = f"{pct(total)} (metadata {pct(meta)}, partly filled blocks {pct(empty)})"
        if 0.05 <= total <= 0.10:
            return Verdict(10, claim, measurement, figure, threshold, HOLDS, "in the band")
        if total < 0.05:
            why = "cheaper than claimed; the metadata lives in host memory, not with the KV"
            return Verdict(10, claim, measurement, figure, threshold, SHAPE, why)
        return Verdict(10, claim, measurement, figure, threshold, FAILS, "costs more than claimed")

    def c11(self) -> Verdict:
        claim = (
            "A 5-second reclaim sweep costs 2–3 % CPU and keeps utilization high when blocks leak"
        )
        threshold = (
            "holds if the sweep costs ≤ 5 % of the run's time and lifts effective KV utilization "
            "(leaked tokens not counted) above the run without sweeps; in shape if it lifts it "
            "at a cost under 1 %"
        )
        runs = find_all(self.runs, suite="reclaim")
        swept = next((r for r in runs if r.get("reclaim_every_s")), None)
        plain = next((r for r in runs if not r.get("reclaim_every_s")), None)
        measurement = "burst-variable with some requests leaked halfway (reclaim table), continuous"
        if swept is None or plain is None:
            return Verdict(11, claim, measurement, "n/a", threshold, MISSING, "runs missing")
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
            return Verdict(11, claim, measurement, figure, threshold, FAILS, "no lift")
        if cost < 0.01:
            why = "lifts utilization, and costs far less than claimed"
            return Verdict(11, claim, measurement, figure, threshold, SHAPE, why)
        if cost <= 0.05:
            return Verdict(11, claim, measurement, figure, threshold, HOLDS, "lift at that cost")
        return Verdict(11, claim, measurement, figure, threshold, FAILS, "costs more than claimed")


def judge(runs: list[Run], base: int, large: int | None) -> list[dict[str, Any]]:
    return [asdict(v) for v in Judge(runs, base, large).all()]
