"""Is the server's memory given back after a heavy load? (issue 23, defect 6)

    python -m bench.memory_after_load [--load-s 40] [--idle-s 60] [--clients 4]
        [--out bench/results/reliability/memory-after-load.json]

Starts a real ``servedeck serve`` on 127.0.0.1 (a random-weight checkpoint of ``--preset``,
default ``small``, the embedded default; a SQLite file of its own), sends one small request,
and reads the server's resident memory (``VmRSS`` of ``/proc/<pid>/status``): the pre-load
value. Then ``--clients`` clients send heavy requests that the cost bounds allow for
``--load-s`` seconds: ``n`` choices with logprobs and an echoed long prompt, answered whole
(a few MB of JSON each), or streamed and dropped by the client midway (the request aborted).
Then nothing, for ``--idle-s`` seconds, while RSS is sampled every second. The goal: RSS back
within 10 % of its pre-load value ``--idle-s`` after the load ends.

Bounded: the load stops at its deadline (requests in flight are cancelled), every request has
a timeout, and the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench import child_server
from bench.load_requests import events

TOKEN = "memory-after-load-token-0123"
GOAL = 0.10
"""RSS a minute after the load may exceed its pre-load value by this fraction, at most."""
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    preset: str = "small"
    clients: int = 4
    load_s: float = 40.0
    idle_s: float = 60.0
    prompt_tokens: int = 600
    n: int = 8
    logprobs: int = 5
    max_tokens: int = 32
    drop_after_chunks: int = 8
    seed: int = 0
    server_args: tuple[str, ...] = ()


@dataclass
class MemoryReport:
    config: MemoryConfig
    rss_start_mib: float = 0.0
    """Just after the model loaded, before any request."""
    rss_before_mib: float = 0.0
    """The pre-load value: after one small request (lazy set-up counted)."""
    rss_peak_mib: float = 0.0
    rss_load_end_mib: float = 0.0
    rss_after_idle_mib: float = 0.0
    """``idle_s`` after the load ended."""
    growth_after_idle: float = 0.0
    """``rss_after_idle / rss_before - 1``."""
    requests: dict[str, int] = field(default_factory=dict)
    """By outcome: whole answers, streams dropped midway, refusals (their status), transport
    errors, and requests still in flight at the deadline (cancelled)."""
    response_mib: float = 0.0
    """Bytes of whole answers read, in all."""
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the load started, RSS MiB), every second."""
    ok: bool = False


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def bodies(config: MemoryConfig, vocab_size: int) -> tuple[dict, dict]:
    rng = random.Random(config.seed)
    prompt = [rng.randrange(5, vocab_size) for _ in range(config.prompt_tokens)]
    whole = {
        "prompt": prompt,
        "n": config.n,
        "logprobs": config.logprobs,
        "echo": True,
        "max_tokens": config.max_tokens,
        "ignore_eos": True,
    }
    return whole, {**whole, "stream": True}


async def client(
    http: httpx.AsyncClient, index: int, deadline: float, config: MemoryConfig, report: MemoryReport
) -> None:
    whole, streamed = bodies(config, 4096)
    kind = index % 2
    while time.monotonic() < deadline:
        kind ^= 1
        try:
            if kind:
                response = await http.post("/v1/completions", json=whole)
                outcome = (
                    "whole" if response.status_code == 200 else f"status_{response.status_code}"
                )
                report.response_mib += len(response.content) / 2**20
            else:
                async with http.stream("POST", "/v1/completions", json=streamed) as response:
                    outcome = (
                        "dropped"
                        if response.status_code == 200
                        else f"status_{response.status_code}"
                    )
                    chunks = 0
                    async with contextlib.aclosing(events(response)) as stream:
                        async for _ in stream:
                            chunks += 1
                            if chunks >= config.drop_after_chunks:
                                break  # the client goes away: the request is aborted
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        except asyncio.CancelledError:
            count(report, "cancelled_at_deadline")
            raise
        count(report, outcome)


def count(report: MemoryReport, outcome: str) -> None:
    report.requests[outcome] = report.requests.get(outcome, 0) + 1


async def sampler(pid: int, started: float, until: float, report: MemoryReport) -> None:
    while (now := time.monotonic()) < until:
        rss = rss_mib(pid)
        report.samples.append((round(now - started, 1), round(rss, 1)))
        report.rss_peak_mib = max(report.rss_peak_mib, rss)
        await asyncio.sleep(1.0)


async def drive(url: str, pid: int, config: MemoryConfig, report: MemoryReport) -> None:
    limits = httpx.Limits(max_connections=config.clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        warm = await http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
        warm.raise_for_status()
        await asyncio.sleep(2.0)
        report.rss_before_mib = rss_mib(pid)
        started = time.monotonic()
        load_end = started + config.load_s
        sampling = asyncio.create_task(sampler(pid, started, load_end + config.idle_s, report))
        clients = [
            asyncio.create_task(client(http, i, load_end, config, report))
            for i in range(config.clients)
        ]
        await asyncio.wait(clients, timeout=max(0.0, load_end - time.monotonic()))
        for task in clients:
            task.cancel()  # a request still in flight at the deadline is cancelled
        await asyncio.gather(*clients, return_exceptions=True)
        report.rss_load_end_mib = rss_mib(pid)
        await sampling
        report.rss_after_idle_mib = rss_mib(pid)


def run(config: MemoryConfig, workdir: Path | None = None) -> MemoryReport:
    from engine.checkpoint import init_model

    report = MemoryReport(config)
    with tempfile.TemporaryDirectory(prefix="servedeck-memory-") as tmp:
        root = workdir or Path(tmp)
        model_dir = init_model(root / config.preset, config.preset, seed=0)
        proc, url = child_server.start_server(model_dir, root, TOKEN, list(config.server_args))
        try:
            time.sleep(2.0)
            report.rss_start_mib = rss_mib(proc.pid)
            asyncio.run(drive(url, proc.pid, config, report))
        finally:
            child_server.stop_server(proc)
    report.growth_after_idle = report.rss_after_idle_mib / report.rss_before_mib - 1
    report.ok = report.growth_after_idle <= GOAL
    for name in ("rss_start_mib", "rss_before_mib", "rss_peak_mib", "rss_load_end_mib"):
        setattr(report, name, round(getattr(report, name), 1))
    report.rss_after_idle_mib = round(report.rss_after_idle_mib, 1)
    report.growth_after_idle = round(report.growth_after_idle, 4)
    report.response_mib = round(report.response_mib, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    defaults = MemoryConfig()
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory_after_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", default=defaults.preset, help="checkpoint preset")
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--load-s", type=float, default=defaults.load_s, help="seconds of load")
    parser.add_argument("--idle-s", type=float, default=defaults.idle_s, help="seconds idle")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument(
        "server_args", nargs="*", help="after --: more servedeck serve flags", default=[]
    )
    args = parser.parse_args(argv)
    config = MemoryConfig(
        preset=args.preset,
        clients=args.clients,
        load_s=args.load_s,
        idle_s=args.idle_s,
        server_args=tuple(args.server_args),
    )
    report = run(config)
    text = json.dumps(asdict(report), indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {k: v for k, v in asdict(report).items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
