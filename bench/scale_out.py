"""Scale-out throughput: one replica with N threads against N replicas with one thread each,
the same total threads, the same load, in one run.

Each arm is a real ``servedeck serve --replicas R --num-threads T`` (which starts its own local
Ray instance on loopback and stops it on exit; bench/ does not import control/);
the load is ``--requests`` completions (random token prompts, greedy, ``ignore_eos``) sent
``--concurrency`` at a time over HTTP. The figure is generated tokens / wall time of the load,
plus request latency percentiles; results go to ``bench/results/scale-out/``.

    .venv/bin/python -m bench.scale_out                   # tiny model, 1x2 vs 2x1
    .venv/bin/python -m bench.scale_out --preset small --requests 64 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.child_server import start_server, stop_server
from bench.machine import describe, finish

RESULTS = Path(__file__).parent / "results" / "scale-out"
TOKEN = "scale-out-bench-token-7c1e"


async def _load(
    url: str, requests: int, concurrency: int, prompt_len: int, max_tokens: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 4000) for _ in range(prompt_len)] for _ in range(requests)]
    latencies: list[float] = []
    tokens = 0
    gate = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, prompt: list[int]) -> None:
        nonlocal tokens
        async with gate:
            body = {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            started = time.perf_counter()
            response = await http.post("/v1/completions", json=body)
            response.raise_for_status()
            latencies.append(time.perf_counter() - started)
            tokens += response.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await one(http, prompts[0])  # warm-up, not counted
        latencies.clear()
        tokens = 0
        started = time.perf_counter()
        await asyncio.gather(*(one(http, p) for p in prompts))
        wall = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": requests,
        "generated_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "requests_per_s": round(requests / wall, 3),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_p90_s": round(latencies[int(0.9 * (len(latencies) - 1))], 3),
    }


def _spread(url: str) -> dict[str, int]:
    body = httpx.get(f"{url}/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    return {r["replica"]: r["generation_tokens"] for r in body.get("replicas", [])}


def run_arm(
    model: Path, replicas: int, threads: int, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    flags = [
        "--replicas", str(replicas), "--num-threads", str(threads), "--policy", "continuous",
    ]  # fmt: skip
    proc, url = start_server(model, workdir, TOKEN, flags)
    try:
        result = asyncio.run(
            _load(url, args.requests, args.concurrency, args.prompt_len, args.max_tokens, args.seed)
        )
        result["tokens_by_replica"] = _spread(url)
    finally:
        stop_server(proc)
    return {"replicas": replicas, "threads_per_replica": threads, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="checkpoint preset (random weights)")
    parser.add_argument("--threads", type=int, default=2, help="total torch threads per arm")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from engine.checkpoint import init_model

    started = time.perf_counter()
    info = describe(args.threads, "cpu")
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        root = Path(tmp)
        model = init_model(root / args.preset, args.preset, seed=0)
        arms = [
            run_arm(model, 1, args.threads, args, root / "one"),
            run_arm(model, args.threads, 1, args, root / "many"),
        ]
    one, many = arms
    report = {
        "what": "throughput: 1 replica x N threads vs N replicas x 1 thread, same load",
        "config": vars(args) | {"out": str(args.out)},
        "arms": arms,
        "speedup_tokens_per_s": round(many["tokens_per_s"] / one["tokens_per_s"], 2),
        "machine": finish(info, time.perf_counter() - started),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.preset}-{args.threads}threads"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Scale-out: {args.preset}, {args.threads} threads in all",
        "",
        "| arm | tokens/s | requests/s | p50 s | p90 s | tokens by replica |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        lines.append(
            f"| {arm['replicas']} x {arm['threads_per_replica']} threads | {arm['tokens_per_s']} | "
            f"{arm['requests_per_s']} | {arm['latency_p50_s']} | {arm['latency_p90_s']} | "
            f"{sorted(arm['tokens_by_replica'].values())} |"
        )
    lines += ["", f"speedup (tokens/s): {report['speedup_tokens_per_s']}x", ""]
    (args.out / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
