"""``servedeck load``'s command line: the arguments, the run and the summary table
(the generator itself is ``bench.load``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from bench.chat_prompts import ChatPrompts
from bench.load import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, LoadConfig, run_load
from sim.trace import Uniform

SHIPPED = "shipped"
"""``--chat-prompts`` without a file: the project's own set (``bench/demo_prompts.json``)."""

SUMMARY_ROWS = (
    ("completed", "requests completed", "{:.0f}"),
    ("failed", "requests failed", "{:.0f}"),
    ("duration_s", "duration (s)", "{:.1f}"),
    ("request_throughput", "requests/s", "{:.2f}"),
    ("output_throughput", "output tok/s", "{:.1f}"),
    ("ttft_p50", "TTFT p50 (ms)", "ms"),
    ("ttft_p90", "TTFT p90 (ms)", "ms"),
    ("ttft_p99", "TTFT p99 (ms)", "ms"),
    ("tpot_p50", "TPOT p50 (ms)", "ms"),
    ("tpot_p99", "TPOT p99 (ms)", "ms"),
    ("e2e_p50", "e2e p50 (ms)", "ms"),
    ("e2e_p99", "e2e p99 (ms)", "ms"),
)


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    for key, label, fmt in SUMMARY_ROWS:
        value = summary.get(key)
        if value is None:
            text = "-"
        elif fmt == "ms":
            text = f"{value * 1000:.0f}"
        else:
            text = fmt.format(value)
        lines.append(f"{label:<20} {text:>10}")
    return "\n".join(lines)


def _span(text: str) -> Uniform:
    lo, _, hi = text.partition("-")
    try:
        span = Uniform(int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI, got {text!r}") from None
    if not 1 <= span.lo <= span.hi:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return span


def _chat_prompts(text: str) -> ChatPrompts:
    try:
        return ChatPrompts.shipped() if text == SHIPPED else ChatPrompts.read(Path(text))
    except (OSError, ValidationError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def add_parser(sub: Any) -> None:
    p = sub.add_parser("load", help="send OpenAI requests to a server and report latency")
    p.add_argument("--url", default=os.environ.get("SERVEDECK_URL", LoadConfig.url))
    p.add_argument("--api-key", default=os.environ.get("SERVEDECK_API_KEY"))
    p.add_argument("--model", help="model id (default: the server's first)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    mode.add_argument("--concurrency", type=int, help="closed loop: clients in parallel")
    mode.add_argument("--trace", type=Path, help="open loop: replay a trace CSV (sim format)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of sending (rate, C)")
    p.add_argument("--prompt-tokens", type=_span, default=DEFAULT_PROMPT_TOKENS)
    p.add_argument("--output-tokens", type=_span, default=DEFAULT_OUTPUT_TOKENS)
    p.add_argument(
        "--chat-prompts",
        type=_chat_prompts,
        nargs="?",
        const=SHIPPED,
        metavar="FILE",
        help="send these chat conversations to /v1/chat/completions instead of token-id "
        "prompts (bench/chat_prompts.py says the format; no FILE: the shipped demo set)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the summary here")
    p.set_defaults(func=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    config = LoadConfig(
        url=args.url,
        api_key=args.api_key,
        model=args.model,
        rate=args.rate,
        concurrency=args.concurrency,
        trace=args.trace,
        duration_s=None if args.trace is not None else args.duration,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
        chat_prompts=args.chat_prompts,
    )
    try:
        result = run_load(config)
    except httpx.HTTPError as exc:
        print(f"servedeck load: {config.url}: {exc}", file=sys.stderr)
        return 1
    summary = result.summary()
    print(format_summary(summary))
    for failure in result.failures[:5]:
        print(f"failed: {failure}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if result.failed and not result.records else 0
