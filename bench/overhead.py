"""The engine's own bookkeeping cost per sequence-step (policy, BlockManager, step loop).

Drives the real ``LLMEngine`` with no model: a runner that returns a placeholder token for
every sampling row at zero cost, and a virtual clock that advances a fixed amount per step
(so aging and timestamps do not depend on how fast this machine is). A burst of requests
arrives at once; the figure is wall time / Σ sequences scheduled over all steps.

    .venv/bin/python -m bench.overhead --requests 2000 --policies continuous hybrid
    .venv/bin/python -m bench.overhead --profile continuous   # cProfile's top functions
    .venv/bin/python -m bench.overhead --queue fair --tenants 1000   # the fair queue's cost

``--queue`` picks the queue discipline (``--tenants`` spreads the requests round-robin over
that many tenants, priorities 0..9 in turn).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time
from dataclasses import dataclass
from typing import get_args

from pydantic import TypeAdapter

from engine.batch import ScheduledBatch, StepResult
from engine.config import EngineConfig, EngineLimits
from engine.front import QueuedPrompt
from engine.sampling_params import SamplingParams
from policies.queue import QueueName, QueueSpec
from serving.engine import LLMEngine

POLICIES = ("continuous", "hybrid", "dynamic", "static")


class ZeroCostRunner:
    """The runner interface at zero cost: token 0 for every row that samples."""

    last_forward_s = 0.0

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.clock.now += self.clock.step_s
        return StepResult([0 for e in batch.entries if e.sample])


@dataclass
class StepClock:
    """A virtual clock the runner advances by ``step_s`` per step."""

    now: float = 0.0
    step_s: float = 0.001

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class OverheadResult:
    policy: str
    requests: int
    steps: int
    seq_steps: int
    wall_s: float
    cpu_s: float

    @property
    def us_per_seq_step(self) -> float:
        return 1e6 * self.wall_s / self.seq_steps

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    def line(self) -> str:
        return (
            f"{self.policy:<11} {self.requests:>6} req {self.steps:>7} steps "
            f"{self.seq_steps:>9} seq-steps {self.wall_s:>7.2f} s "
            f"{self.us_per_seq_step:>6.2f} µs/seq-step {self.steps_per_s:>8.0f} steps/s "
            f"(cpu {1e6 * self.cpu_s / self.seq_steps:.2f} µs/seq-step)"
        )


def build(policy: str, args: argparse.Namespace) -> LLMEngine:
    clock = StepClock()
    config = EngineConfig(
        model="none",
        policy=policy,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_waiting=args.requests,
    )
    limits = EngineLimits(
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_model_len=args.max_prompt + args.output + 16,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    queue = TypeAdapter(QueueSpec).validate_python({"name": args.queue})
    engine = LLMEngine(
        config, ZeroCostRunner(clock), limits, vocab_size=32000, clock=clock, queue=queue
    )
    rng = random.Random(args.seed)
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)
    for i in range(args.requests):
        length = rng.randint(args.min_prompt, args.max_prompt)
        tokens = [rng.randrange(32000) for _ in range(length)]
        tenant = f"t{i % args.tenants}"
        engine.add_requests([QueuedPrompt(tokens, params, f"r{i}", i % 10, tenant)])
    return engine


def run(engine: LLMEngine) -> tuple[int, int, float, float]:
    """Step the engine until every request is done: (steps, seq-steps, wall s, CPU s)."""
    started, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        engine.step()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return engine.stats.num_steps, engine.stats.seq_steps, wall, cpu


def measure(policy: str, args: argparse.Namespace) -> OverheadResult:
    """Best of ``args.repeat`` runs (the machine is shared: the fastest run is the engine's)."""
    best: OverheadResult | None = None
    for _ in range(args.repeat):
        steps, seq_steps, wall, cpu = run(build(policy, args))
        if best is None or wall < best.wall_s:
            best = OverheadResult(policy, args.requests, steps, seq_steps, wall, cpu)
    assert best is not None
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--min-prompt", type=int, default=500)
    parser.add_argument("--max-prompt", type=int, default=2000)
    parser.add_argument("--output", type=int, default=200)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kv-blocks", type=int, default=65536)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queue", choices=get_args(QueueName), default="fcfs")
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="report the fastest of N runs")
    parser.add_argument("--profile", choices=POLICIES, help="cProfile one policy instead")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if args.profile:
        engine = build(args.profile, args)
        profiler = cProfile.Profile()
        profiler.runcall(run, engine)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
        return
    for policy in args.policies:
        print(measure(policy, args).line(), flush=True)


if __name__ == "__main__":
    main()
