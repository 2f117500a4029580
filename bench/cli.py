"""``servedeck bench`` (control/cli.py adds this parser): run a preset, write results.json,
report.md and the plots. Without the CLI: ``python -m bench.cli --preset quick``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.presets import PEERS, POLICIES, PRESETS, SUITES

DEFAULT_THREADS = 2


def _names(value: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="quick", choices=sorted(PRESETS))
    parser.add_argument("--model", help="Hugging Face model folder (default: the preset's)")
    parser.add_argument(
        "--policies",
        type=lambda v: _names(v, POLICIES, "policy"),
        help=f"comma-separated subset of {','.join(POLICIES)} (default: all)",
    )
    parser.add_argument(
        "--peers",
        type=lambda v: _names(v, (*PEERS, "none"), "peer"),
        help=f"comma-separated subset of {','.join(PEERS)}, or none (default: the preset's)",
    )
    parser.add_argument(
        "--suites",
        type=lambda v: _names(v, SUITES, "suite"),
        help=f"comma-separated subset of {','.join(SUITES)} (default: all)",
    )
    parser.add_argument("--out", help="output folder (default: bench/results/<preset>)")
    parser.add_argument(
        "--threads", type=int, default=DEFAULT_THREADS, help="torch threads (default 2)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--plan", action="store_true", help="list the runs and their token counts, run nothing"
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="run the batching benchmarks and write results.json, report.md and plots"
    )
    add_arguments(parser)
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from bench import machine
    from bench.plan import Plan
    from bench.report import write_outputs
    from bench.runner import EngineFactory
    from bench.suite import Bench, model_path
    from engine.model.formats import read_model_config

    preset = PRESETS[args.preset]
    torch.set_num_threads(args.threads)
    policies = args.policies or preset.policies
    peers = () if args.peers and "none" in args.peers else (args.peers or preset.peers)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    out = Path(args.out or Path("bench") / "results" / preset.name)
    model_dir = model_path(preset, args.model)
    suites = args.suites or SUITES
    if args.plan:
        vocab = read_model_config(model_dir).vocab_size
        print_plan(Plan(preset, policies, peers, vocab, suites).build())
        return 0
    started = time.perf_counter()
    info = machine.describe(args.threads, args.device)
    factory = EngineFactory(model_dir, args.device, dtype)
    plan = Plan(preset, policies, peers, factory.vocab_size, suites).build()
    output = Bench(preset, factory, plan, args.device, dtype, label=f"bench {preset.name}").run()
    info = machine.finish(info, time.perf_counter() - started)
    info["model"] = str(model_dir)
    info["dtype"] = dtype
    paths = write_outputs(out, preset, info, output, not args.no_plots, command_line(args))
    for skipped in output.skipped:
        print(f"skipped: {skipped}", file=sys.stderr)
    for path in paths:
        print(path)
    return 0


def print_plan(plan: Sequence[Any]) -> None:
    prompt = output = 0
    for spec in plan:
        w = spec.workload
        prompt, output = prompt + w.prompt_tokens, output + w.output_tokens
        print(f"{spec.id:<72} {len(w.requests):>5} requests {w.prompt_tokens:>7} prompt "
              f"{w.output_tokens:>6} output tokens")  # fmt: skip
    print(f"{len(plan)} runs, {prompt} prompt and {output} output tokens")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (what the report says made it)."""
    parts = ["servedeck bench", f"--preset {args.preset}"]
    for flag in ("policies", "peers", "suites"):
        if getattr(args, flag):
            parts.append(f"--{flag} {','.join(getattr(args, flag))}")
    if args.model:
        parts.append(f"--model {args.model}")
    if args.threads != DEFAULT_THREADS:
        parts.append(f"--threads {args.threads}")
    if args.device != "cpu":
        parts.append(f"--device {args.device}")
    return " ".join(parts)


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servedeck bench", description=__doc__)
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(run())
