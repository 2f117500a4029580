"""The replay bound: a run's recorded batch shapes, back to back, through the runner alone.

No policy, no block manager, no request bookkeeping: each step's batch is rebuilt from its
shapes (same sequences' context lengths, new tokens and padding, same rows sampled, same
block tables) with synthetic token ids, and only the model forward is timed, exactly as the
engine's ``forward_s`` is (model, logits, sampling). Token values do not change the cost of a
dense forward; block placement can (gathers from scattered blocks), so the recorded tables are
reused. The replay writes into the KV pool it is given: run it only on an engine that is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.recording import EntryShape
from engine.batch import ScheduledBatch, ScheduledSeq
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

GREEDY = SamplingParams(max_tokens=1, temperature=0.0)
TOKEN_ID = 2


@dataclass(frozen=True, slots=True)
class ReplayResult:
    forward_s: float
    wall_s: float
    steps: int


def _sequence(
    index: int, shape: EntryShape, first_block: int, num_blocks: int, size: int
) -> Sequence:
    if shape.new == 0:  # a finished row recomputing its last token
        length = shape.computed
    elif shape.sample:
        length = shape.computed + shape.new
    else:  # a prefill chunk that stops short of the prompt's end
        length = shape.computed + shape.new + 1
    seq = Sequence(f"replay-{index}", [TOKEN_ID] * length, GREEDY, 0.0)
    seq.num_computed_tokens = shape.computed
    span = max(length, shape.computed + shape.new + shape.pads)
    needed = -(-span // size)
    if len(shape.blocks) >= needed:
        seq.block_table = list(shape.blocks)
    else:
        seq.block_table = [(first_block + j) % num_blocks for j in range(needed)]
    return seq


def build_batch(shapes: list[EntryShape], num_blocks: int, block_size: int) -> ScheduledBatch:
    batch = ScheduledBatch(mode="replay")
    next_block = 0
    for i, shape in enumerate(shapes):
        seq = _sequence(i, shape, next_block, num_blocks, block_size)
        next_block = (next_block + len(seq.block_table)) % num_blocks
        batch.entries.append(ScheduledSeq(seq, shape.new, shape.pads))
    return batch


def replay(runner: ModelRunner, steps: list[list[EntryShape]]) -> ReplayResult:
    num_blocks = runner.kv_caches[0].shape[1]
    forward = 0.0
    started = time.perf_counter()
    for shapes in steps:
        runner.execute(build_batch(shapes, num_blocks, runner.block_size))
        forward += runner.last_forward_s
    return ReplayResult(forward, time.perf_counter() - started, len(steps))
