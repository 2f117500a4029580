"""The report's sections after the burst tables: ratios, issue 2's workload with its peers,
the sweeps, Poisson load, short/long prompts, maintenance, targets, definitions, claims."""

from __future__ import annotations

from typing import Any

from bench.metrics import LATENCY_KEYS, THROUGHPUT_KEYS, TTFT_KEYS
from bench.ratios import Run, find_all
from bench.tables import COLUMNS, Column, columns, num, table


def ratios_section(ratios: dict[str, Any]) -> list[str]:
    out = ["## Ratios: continuous over each other policy (same requests, same process)", ""]
    out += [
        "| workload | vs | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | e2e p50 | KV util |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, pairs in ratios.items():
        for pair, r in pairs.items():
            cells = [num(r.get(m)) for m in ("output_throughput", *LATENCY_KEYS, "kv_utilization")]
            out.append(f"| {key} | {pair.split('/')[1]} | " + " | ".join(cells) + " |")
    return [*out, "", "Throughput: above 1 means continuous is faster. Latency: below 1 means "
            "continuous is lower.", ""]  # fmt: skip


def mixed_section(runs: list[Run], scale: float) -> list[str]:
    group = [r for r in runs if r["workload"] == "mixed"]
    if not group:
        return []
    cols = columns(
        "policy",
        *THROUGHPUT_KEYS,
        *LATENCY_KEYS,
        "kv_utilization",
        "padding_waste_prefill",
        "engine_overhead_batch32",
        "replay_efficiency",
        "outputs_equal_to_continuous",
    )
    n = group[0]["num_requests"]
    lengths = "prompts uniform 32–512, 64 new tokens" + (f", ÷ {scale:g}" if scale != 1 else "")
    return [
        f"## Issue 2's workload: {n} requests, {lengths}, one burst — with peers",
        "",
        "`hf-static` is transformers' `generate` on left-padded batches; `hf-continuous` is "
        "transformers' `generate_batch` with `num_blocks` and `max_batch_tokens` set. Same "
        "checkpoint, same threads, greedy; 'same tokens' compares each peer's outputs with "
        "the continuous policy's.",
        "",
        *table(group, cols),
        *gather_lines(runs),
    ]


def gather_lines(runs: list[Run]) -> list[str]:
    """The torch backend's decode re-gathers, continuous on the mixed workload and the
    100-request bursts (issue 16's goal: at most 5 per 100 decode steps on the mixed one)."""
    picked = [
        r
        for r in runs
        if r.get("policy") == "continuous"
        and r.get("regathers_per_100_decode_steps") is not None
        and (r["workload"] == "mixed" or (r.get("suite") == "burst" and r["concurrency"] == 100))
    ]
    if not picked:
        return []
    cols = columns(
        Column("workload", "continuous on", str),
        Column("decode_steps", "steps with decode rows"),
        "regathers_per_100_decode_steps",
        "decode_row_copies",
    )
    return [
        "Decode K/V re-gathers (every row copied afresh from the pool) and row copies (a row "
        "joining, moving or changed) in the torch backend's kept decode buffers:",
        "",
        *table(picked, cols),
    ]


def sweep_section(runs: list[Run]) -> list[str]:
    sweep = find_all(runs, suite="batch-sweep")
    if not sweep:
        return []
    cols = columns(
        "policy",
        Column("concurrency", "batch size (clients)"),
        "output_throughput",
        *TTFT_KEYS,
        "tpot_p50",
        "mean_batch_size",
        "kv_utilization",
        "engine_overhead",
    )
    ordered = sorted(sweep, key=lambda r: (r["policy"], r["concurrency"]))
    return [
        "## Batch-size sweep (the article's table)",
        "",
        "A closed loop of B clients (each sends its next request when its last one is done) "
        "with the policy's max batch size set to B, on the fixed-output lengths.",
        "",
        *table(ordered, cols),
    ]


def block_section(runs: list[Run], base: int) -> list[str]:
    rows = find_all(runs, suite="block-sweep")
    if not rows:
        return []
    cols = columns(
        "policy",
        "block_size",
        "output_throughput",
        *LATENCY_KEYS,
        "kv_utilization",
    )
    ordered = sorted(rows, key=lambda r: (r["policy"], r["block_size"]))
    return [
        f"## Block-size sweep (burst-fixed, {base} concurrent, same KV memory)",
        "",
        "Sizes run interleaved (16, 32, 64, then again where the preset repeats them); "
        "run-to-run noise on a 2-core machine is several percent.",
        "",
        *table(ordered, cols),
    ]


def poisson_section(runs: list[Run], saturation: float | None) -> list[str]:
    rows = sorted(find_all(runs, suite="poisson"), key=lambda r: (r["load"], r["policy"]))
    if not rows:
        return []
    cols = columns(
        "load",
        "rate",
        "policy",
        "output_throughput",
        *LATENCY_KEYS,
        "goodput",
    )
    return [
        "## Poisson arrivals at fractions of continuous's saturation rate",
        "",
        f"Saturation rate: {num(saturation)} requests/s (continuous on the variable-output "
        "burst). Idle gaps are skipped on the clock, not slept.",
        "",
        *table(rows, cols),
    ]


def short_long_section(runs: list[Run]) -> list[str]:
    rows = find_all(runs, suite="short-long")
    if not rows:
        return []
    cols = columns(
        "policy",
        "output_throughput",
        "ttft_p50_short",
        "ttft_p99_short",
        "ttft_p50_long",
        "tpot_p50",
        "e2e_p50",
        "kv_utilization",
        "padding_waste",
    )
    return ["## Mostly short prompts with a few very long ones (burst)", "", *table(rows, cols)]


def maintenance_section(runs: list[Run]) -> list[str]:
    out: list[str] = []
    reserve = sorted(find_all(runs, suite="reserve"), key=lambda r: r["memory_reserve"])
    if reserve:
        cols = columns(
            "memory_reserve",
            "kv_pool_tokens",
            "output_throughput",
            *TTFT_KEYS,
            COLUMNS["preemptions"].titled("preemptions"),
            "refused",
            "mean_batch_size",
        )
        out += ["## Memory reserve under overload (continuous)", "", *table(reserve, cols)]
    capacity = find_all(runs, suite="capacity")
    if capacity:
        cols = columns(
            "policy",
            "kv_pool_tokens",
            "mean_requests_holding_kv",
            "max_requests_holding_kv",
            "output_throughput",
            "kv_utilization",
            "bookkeeping_bytes",
            "kv_bytes_held_at_peak",
        )
        out += ["## Concurrency at the same KV memory", "", *table(capacity, cols)]
    depth = sorted(
        find_all(runs, suite="hybrid-depth"), key=lambda r: (r["concurrency"], r["policy"])
    )
    if depth:
        cols = columns(
            Column("concurrency", "depth (clients)"),
            "policy",
            "output_throughput",
            *LATENCY_KEYS,
        )
        out += ["## Shallow queues: hybrid (one at a time below depth 4) vs continuous", "",
                *table(depth, cols)]  # fmt: skip
    reclaim = find_all(runs, suite="reclaim")
    if reclaim:
        cols = columns(
            "reclaim_every_s",
            "leaked",
            "reclaims",
            "reclaimed_blocks",
            "reclaim_cpu_share",
            "kv_leaked_share",
            "kv_utilization_effective",
            "output_throughput",
            COLUMNS["preemptions"].titled("preemptions"),
        )
        out += ["## Leaked blocks and the reclaim sweep (continuous)", "", *table(reclaim, cols)]
    return out


def targets_section(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["## Issue 7 targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in rows:
        met = {True: "yes", False: "**no**", None: "–"}[t["met"]]
        out.append(f"| {t['name']} | {t['figure']} | {t['goal']} | {met} |")
    return [*out, ""]


def claims_section(claims: list[dict[str, Any]], command: str) -> list[str]:
    out = [
        "## The article's claims",
        "",
        f"Measured by `{command}`; each verdict is computed from this run's numbers against "
        "the stated threshold.",
        "",
        "| # | claim | measurement | figure | threshold | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in claims:
        verdict = c["verdict"] if c["verdict"] == "holds" else f"**{c['verdict']}**"
        out.append(
            f"| {c['number']} | {c['claim']} | {c['measurement']} | {c['figure']} | "
            f"{c['threshold']} | {verdict}: {c['why']} |"
        )
    return [*out, ""]


def definitions() -> list[str]:
    return [
        "## Definitions",
        "",
        "- TTFT: first token − arrival (queueing included). TPOT: (last token − first token) / "
        "(output tokens − 1), that is (e2e − TTFT) / (output tokens − 1) for a request that "
        "ends at its last token. ITL: gaps between consecutive tokens, pooled. e2e: finish − "
        "arrival. Percentiles interpolate linearly (vLLM's `benchmark_serving`, numpy's "
        "default). The engine defines these (`RequestMetrics`, `engine.stats.percentile`), so "
        "`/admin/state` gives the same figures for the same requests.",
        "- Throughput: tokens (or requests) completed / duration, duration = run start to last "
        "finish. Goodput: requests meeting both SLOs / duration.",
        "- KV utilization: Σ over steps of tokens stored (after the step's forward) / Σ over "
        "steps of slots held by sequences — a ratio of sums, each step weighted by the slots "
        "it holds, not by its duration. Slots reserved for padding or not-yet-generated tokens "
        "count as held.",
        "- Padding waste: padded / computed tokens; prefill and decode apart (decode padding is "
        "finished rows a padded group keeps computing).",
        "- Engine overhead: (Σ step wall − Σ forward) / Σ step wall; the forward is the model, "
        "logits and sampling (`ModelRunner.last_forward_s`), the bench's own bookkeeping is "
        "taken out of the wall time. 'At batch ≥ 32' keeps only steps of 32 sequences or more.",
        "- Replay bound: the run's recorded batch shapes (per sequence: context, new tokens, "
        "padding, sampled or not) rebuilt and run back to back through the runner alone; its "
        "Σ forward time / the run's busy time is the efficiency.",
        "",
    ]
