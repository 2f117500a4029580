"""How each of the article's claims is judged: one rule per claim, reading the thresholds
from the claim's named ``values`` (``bench.claims.CLAIMS`` pairs each rule with its claim)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.evidence import FAILS, HOLDS, MISSING, SHAPE, Evidence, Finding, missing, multiplier
from bench.formatting import ms, pct, times
from bench.ratios import Run, divide, find, find_all

if TYPE_CHECKING:
    from bench.claims import Claim


def concurrency_gain(ev: Evidence, claim: Claim) -> Finding:
    return multiplier(claim, ev.throughput_ratio(ev.base))


def gap_grows(ev: Evidence, claim: Claim) -> Finding:
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


def lower_ttft(ev: Evidence, claim: Claim) -> Finding:
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


def kv_utilization(ev: Evidence, claim: Claim) -> Finding:
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


def capacity(ev: Evidence, claim: Claim) -> Finding:
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


def batch_sweep(ev: Evidence, claim: Claim) -> Finding:
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


def block_size(ev: Evidence, claim: Claim) -> Finding:
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


def reserve(ev: Evidence, claim: Claim) -> Finding:
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


def shallow_queue(ev: Evidence, claim: Claim) -> Finding:
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


def bookkeeping(ev: Evidence, claim: Claim) -> Finding:
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


def reclaim(ev: Evidence, claim: Claim) -> Finding:
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
