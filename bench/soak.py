"""Soak with faults: a real server on 127.0.0.1 under skewed traffic, dropped streams, a policy
switch every second and the reclaim sweep every second; then the books are checked.

    python -m bench.soak --duration 300 --out bench/results/soak/soak.json

What it checks at the end (``SoakReport.problems`` names each breach):
- every completed greedy request equals its offline output (the same checkpoint through ``LLM``);
- no request waited past the aging bound: TTFT (an upper bound on its wait) stays under
  ``max_wait_s`` plus the slack given for the batch in flight;
- no 5xx, on ``/v1`` or on the admin routes the switcher and the sweep use;
- the idle engine holds no used blocks and the block manager passes its integrity check;
- the server's resident memory grew less than ``max_rss_growth`` between the first sample after
  warm-up and the end.
It only ever talks to 127.0.0.1, and every loop is bounded by ``duration_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from bench import child_server
from bench.load_requests import events
from engine.stats import percentile

POLICY_CYCLE = ("static", "dynamic", "continuous", "hybrid")
TOKEN = "soak-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@dataclass(frozen=True, slots=True)
class SoakConfig:
    duration_s: float = 300.0
    clients: int = 24
    max_model_len: int = 512
    num_prompts: int = 240
    short_fraction: float = 0.90
    short_max_tokens: int = 256
    max_new_tokens: int = 24
    disconnect_fraction: float = 0.10
    stream_fraction: float = 0.5
    switch_every_s: float = 1.0
    reclaim_interval_s: float = 1.0
    max_wait_s: float = 10.0
    wait_slack_s: float = 10.0
    """Time allowed beyond ``max_wait_s`` for the batch in flight to finish."""
    warmup_s: float = 60.0
    """RSS growth is measured from the first sample after this."""
    max_rss_growth: float = 0.10
    num_threads: int = 1
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    max_tokens: int


@dataclass(slots=True)
class Outcome:
    prompt: int
    status: int
    stream: bool
    dropped: bool = False
    text: str = ""
    ttft_s: float | None = None
    e2e_s: float = 0.0
    error: str | None = None


@dataclass(slots=True)
class SoakReport:
    config: SoakConfig
    duration_s: float = 0.0
    requests: int = 0
    completed: int = 0
    dropped: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    server_errors: int = 0
    transport_errors: int = 0
    switches: int = 0
    switch_failures: int = 0
    mismatches: int = 0
    checked_greedy: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_max_s: float | None = None
    e2e_max_s: float | None = None
    aging_violations: int = 0
    idle_used_blocks: int | None = None
    integrity_ok: bool | None = None
    rss_after_warmup_mb: float | None = None
    rss_end_mb: float | None = None
    rss_growth: float | None = None
    problems: list[str] = field(default_factory=list)


def make_prompts(config: SoakConfig, vocab_size: int) -> list[Prompt]:
    """90 % short (<= 256 tokens), the rest up to what the context holds with the output."""
    rng = random.Random(config.seed)
    longest = config.max_model_len - config.max_new_tokens - 1
    prompts = []
    for _ in range(config.num_prompts):
        if rng.random() < config.short_fraction:
            length = rng.randint(4, min(config.short_max_tokens, longest))
        else:
            length = rng.randint(min(config.short_max_tokens, longest - 1) + 1, longest)
        ids = [rng.randrange(10, vocab_size) for _ in range(length)]
        prompts.append(Prompt(ids, rng.randint(4, config.max_new_tokens)))
    return prompts


# -- the server --------------------------------------------------------------------------------


def start_server(
    model_dir: Path, workdir: Path, config: SoakConfig
) -> tuple[subprocess.Popen, str]:
    args = [
        "--num-threads", str(config.num_threads), "--max-model-len", str(config.max_model_len),
        "--max-waiting", "512", "--reclaim-interval-s", str(config.reclaim_interval_s),
    ]  # fmt: skip
    return child_server.start_server(model_dir, workdir, TOKEN, args)


# -- traffic -----------------------------------------------------------------------------------


async def one_request(
    http: httpx.AsyncClient,
    prompts: list[Prompt],
    index: int,
    rng: random.Random,
    config: SoakConfig,
) -> Outcome:
    prompt = prompts[index]
    stream = rng.random() < config.stream_fraction
    drop = stream and rng.random() < config.disconnect_fraction / config.stream_fraction
    body = {
        "prompt": prompt.token_ids,
        "max_tokens": prompt.max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    started = time.monotonic()
    outcome = Outcome(index, 0, stream)
    if not stream:
        response = await http.post("/v1/completions", json=body)
        outcome.status = response.status_code
        outcome.e2e_s = time.monotonic() - started
        if response.status_code == 200:
            outcome.text = response.json()["choices"][0]["text"]
            outcome.ttft_s = outcome.e2e_s  # an upper bound: the first token came before
        else:
            outcome.error = response.text[:200]
        return outcome
    async with http.stream("POST", "/v1/completions", json=body) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            outcome.error = (await response.aread()).decode(errors="replace")[:200]
            return outcome
        keep = rng.randint(1, 3)
        async with contextlib.aclosing(events(response)) as reader:
            async for event in reader:
                if "error" in event:
                    outcome.error = json.dumps(event)[:200]
                    outcome.status = 500
                    break
                if outcome.ttft_s is None:
                    outcome.ttft_s = time.monotonic() - started
                outcome.text += "".join(c["text"] for c in event["choices"])
                keep -= 1
                if drop and keep <= 0:
                    outcome.dropped = True
                    break  # closing the response hangs up mid-stream
    outcome.e2e_s = time.monotonic() - started
    return outcome


async def client_loop(
    url: str, prompts: list[Prompt], seed: int, deadline: float, config: SoakConfig
) -> list[Outcome]:
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as http:
        while time.monotonic() < deadline:
            index = rng.randrange(len(prompts))
            try:
                outcomes.append(await one_request(http, prompts, index, rng, config))
            except httpx.TransportError as exc:
                outcomes.append(Outcome(index, -1, False, error=repr(exc)))
    return outcomes


async def switcher(url: str, deadline: float, config: SoakConfig, report: SoakReport) -> None:
    """A policy switch every ``switch_every_s`` through all four, aging on for each."""
    async with httpx.AsyncClient(base_url=url, timeout=60.0, headers=ADMIN) as http:
        turn = 0
        while time.monotonic() < deadline:
            name = POLICY_CYCLE[turn % len(POLICY_CYCLE)]
            turn += 1
            body = {
                "policy": {"name": name, "params": {"max_wait_s": config.max_wait_s}},
                "reason": "soak: switch every second",
            }
            response = await http.put("/admin/policy", json=body)
            if response.status_code == 200:
                report.switches += 1
            else:
                report.switch_failures += 1
                if response.status_code >= 500:
                    report.server_errors += 1
            await asyncio.sleep(config.switch_every_s)


async def rss_sampler(pid: int, deadline: float, config: SoakConfig, report: SoakReport) -> None:
    process = psutil.Process(pid)
    started = time.monotonic()
    while time.monotonic() < deadline:
        rss = process.memory_info().rss / 2**20
        if report.rss_after_warmup_mb is None and time.monotonic() - started >= config.warmup_s:
            report.rss_after_warmup_mb = rss
        report.rss_end_mb = rss
        await asyncio.sleep(1.0)


async def drive(url: str, pid: int, prompts: list[Prompt], config: SoakConfig) -> tuple:
    report = SoakReport(config)
    started = time.monotonic()
    deadline = started + config.duration_s
    clients = [
        client_loop(url, prompts, config.seed * 1000 + i, deadline, config)
        for i in range(config.clients)
    ]
    per_client, _, _ = await asyncio.gather(
        asyncio.gather(*clients),
        switcher(url, deadline, config, report),
        rss_sampler(pid, deadline, config, report),
    )
    report.duration_s = time.monotonic() - started
    outcomes = [o for batch in per_client for o in batch]
    return report, outcomes


# -- the books ---------------------------------------------------------------------------------


def settle(url: str, report: SoakReport, timeout_s: float = 60.0) -> None:
    """Wait until the engine is idle, sweep once, then read its KV books."""
    with httpx.Client(base_url=url, headers=ADMIN, timeout=30.0) as http:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = http.get("/admin/state").json()
            if not state["requests"]:
                break
            time.sleep(0.2)
        http.post("/admin/reclaim")
        state = http.get("/admin/state").json()
        kv = state["kv"]
        report.idle_used_blocks = kv["used"]
        integrity = http.get("/admin/kv/integrity")
        if integrity.status_code == 200:
            report.integrity_ok = bool(integrity.json()["ok"])
        else:  # no integrity route: at least the states must add up
            report.integrity_ok = kv["free"] + kv["used"] + kv["cached"] == kv["total"]


def reference_texts(model_dir: Path, prompts: list[Prompt], wanted: set[int], config: SoakConfig):
    from engine.sampling_params import SamplingParams
    from serving.llm import LLM

    llm = LLM(model_dir, max_model_len=config.max_model_len, num_threads=config.num_threads)
    order = sorted(wanted)
    outputs = llm.generate(
        [prompts[i].token_ids for i in order],
        [SamplingParams(max_tokens=prompts[i].max_tokens, temperature=0.0) for i in order],
    )
    return {i: out.text for i, out in zip(order, outputs, strict=True)}


def judge(report: SoakReport, outcomes: list[Outcome], references: dict[int, str]) -> None:
    config = report.config
    report.requests = len(outcomes)
    for o in outcomes:
        if o.status == 200 and o.dropped:
            report.dropped += 1
        elif o.status == 200 and o.error is None:
            report.completed += 1
        elif o.status == -1:
            report.transport_errors += 1
        elif o.status >= 500:
            report.server_errors += 1
        else:
            report.refused[str(o.status)] = report.refused.get(str(o.status), 0) + 1
    done = [o for o in outcomes if o.status == 200 and not o.dropped and o.error is None]
    for o in done:
        report.checked_greedy += 1
        if o.text != references[o.prompt]:
            report.mismatches += 1
    ttfts = [o.ttft_s for o in done if o.ttft_s is not None]
    report.ttft_p50_s = percentile(ttfts, 50)
    report.ttft_p99_s = percentile(ttfts, 99)
    report.ttft_max_s = max(ttfts, default=None)
    report.e2e_max_s = max((o.e2e_s for o in done), default=None)
    bound = config.max_wait_s + config.wait_slack_s
    report.aging_violations = sum(t > bound for t in ttfts)
    if report.rss_after_warmup_mb and report.rss_end_mb:
        report.rss_growth = report.rss_end_mb / report.rss_after_warmup_mb - 1
    checks = [
        (report.server_errors == 0, f"{report.server_errors} server errors (5xx)"),
        (report.transport_errors == 0, f"{report.transport_errors} transport errors"),
        (report.mismatches == 0, f"{report.mismatches} greedy outputs differ from offline"),
        (report.aging_violations == 0, f"{report.aging_violations} requests waited > {bound} s"),
        (report.idle_used_blocks == 0, f"idle engine holds {report.idle_used_blocks} used blocks"),
        (report.integrity_ok is True, "block manager integrity check failed"),
        (report.switch_failures == 0, f"{report.switch_failures} policy switches failed"),
        (
            report.rss_growth is None or report.rss_growth < config.max_rss_growth,
            f"resident memory grew {report.rss_growth:.1%}" if report.rss_growth else "",
        ),
    ]
    report.problems = [message for ok, message in checks if not ok]


def run_soak(config: SoakConfig, workdir: Path | None = None) -> SoakReport:
    from engine.checkpoint import PRESETS, init_model

    with tempfile.TemporaryDirectory(prefix="servedeck-soak-") as tmp:
        root = workdir or Path(tmp)
        model_dir = init_model(root / "tiny", "tiny", seed=0)
        prompts = make_prompts(config, PRESETS["tiny"].vocab_size)
        proc, url = start_server(model_dir, root, config)
        try:
            report, outcomes = asyncio.run(drive(url, proc.pid, prompts, config))
            settle(url, report)
        finally:
            proc.terminate()
            proc.wait(60)
        wanted = {o.prompt for o in outcomes if o.status == 200 and not o.dropped}
        references = reference_texts(model_dir, prompts, wanted, config)
        judge(report, outcomes, references)
        return report


def main(argv: list[str] | None = None) -> int:
    defaults = SoakConfig()
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="seconds")
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=defaults.max_model_len,
        help="the server's context; the long tenth of prompts reaches up to it",
    )
    parser.add_argument("--max-wait-s", type=float, default=defaults.max_wait_s, help="aging")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    config = SoakConfig(
        duration_s=args.duration,
        clients=args.clients,
        seed=args.seed,
        max_model_len=args.max_model_len,
        max_wait_s=args.max_wait_s,
    )
    report = run_soak(config)
    text = json.dumps(asdict(report), indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
