"""``servedeck``: the one entry point. Every subcommand imports its floor lazily."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="Hugging Face model folder (default: embedded small)")
    parser.add_argument("--policy", default="continuous")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--block-size", type=int, default=16, choices=[16, 32, 64])
    parser.add_argument("--num-kv-blocks", type=int)
    parser.add_argument("--memory-reserve", type=float, default=0.10)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])


def cmd_init_model(args: argparse.Namespace) -> int:
    from engine.checkpoint import PRESETS, init_model

    path = init_model(args.dir, args.preset, args.seed)
    params = PRESETS[args.preset].num_parameters()
    print(f"wrote {args.preset} checkpoint ({params / 1e6:.1f}M parameters) to {path}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    llm = LLM(
        args.model,
        policy=args.policy,
        device=args.device,
        dtype=args.dtype,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        memory_reserve=args.memory_reserve,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        attention_backend=args.attention_backend,
    )
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    for output in llm.generate(args.prompt, params):
        print(output.text)
        m = output.metrics
        print(
            f"[{len(output.token_ids)} tokens, finish={output.finish_reason}, "
            f"ttft={m.ttft * 1000:.1f} ms, e2e={m.e2e * 1000:.1f} ms]",
            file=sys.stderr,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servedeck", description="LLM serving with switchable batching policies."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init-model", help="write a random-weight Llama checkpoint")
    p.add_argument("dir")
    p.add_argument("--preset", default="small", choices=["tiny", "small", "llama3-8b"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_init_model)

    p = sub.add_parser("generate", help="generate offline from one or more prompts")
    _add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="repeat for several")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.set_defaults(func=cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
