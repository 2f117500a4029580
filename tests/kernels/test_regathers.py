"""Decode rows joining, leaving, growing and moving between buckets cost row copies, not
re-gathers of every row (kernels.decode_gather, the path without the native kernel), and
attend exactly as the oracle does."""

from __future__ import annotations

import random

from engine.sampling_params import SamplingParams
from kernels.decode_gather import RELAYOUT_STEPS, WIDTH_HEADROOM
from serving.llm import LLM
from tests.kernels.test_backends import BLOCK, Seq, World


def test_joins_and_leaves_copy_rows_not_the_batch() -> None:
    world = World("torch", seed=2)
    seqs = [Seq(str(i)) for i in range(12)]
    world.step(prefills=[(s, 5 + 9 * i) for i, s in enumerate(seqs[:8])])
    for _ in range(2):
        world.step(decodes=seqs[:8])
    gathers = world.backend.gathers
    assert gathers.stats()["full_gathers"] == 1 and gathers.row_copies == 0
    world.step(decodes=seqs[:8], prefills=[(seqs[8], 40)])
    world.step(decodes=seqs[:9])  # one joins: its row alone is copied in
    assert gathers.row_copies == 1
    world.step(decodes=[s for s in seqs[:9] if s.seq_id != "0"])  # one leaves: the last moves
    assert gathers.row_copies == 2
    assert gathers.stats()["full_gathers"] == 1
    assert world.kept == [False] + [True] * 4


def test_a_row_outgrowing_the_short_bucket_moves_to_the_long_one() -> None:
    world = World("torch", seed=4)
    short = [Seq(f"s{i}") for i in range(8)]
    long = [Seq(f"l{i}") for i in range(4)]
    # short rows one block wide (one just under the block's end), long rows four blocks
    world.step(prefills=[(s, 3 + i) for i, s in enumerate(short[:-1])] + [(short[-1], BLOCK - 1)])
    world.step(prefills=[(s, 3 * BLOCK + 2 * i) for i, s in enumerate(long)])
    rows = short + long
    world.step(decodes=rows)
    gathers = world.backend.gathers
    buckets = gathers._buckets
    assert len(buckets) == 2 and "s7" in {s.seq_id for s in buckets[0].slots}
    for _ in range(3):  # s7 opens its second block: wider than the short bucket's limit
        world.step(decodes=rows)
    assert "s7" in {s.seq_id for s in buckets[1].slots}
    assert gathers.stats()["full_gathers"] == 1
    assert gathers.row_copies == 1  # s7 into the long bucket (it was the short bucket's last)


def test_the_mixed_burst_regathers_at_most_5_per_100_decode_steps(tiny_model_dir) -> None:
    rng = random.Random(16)
    prompts = [[rng.randrange(3, 4000) for _ in range(rng.randint(32, 200))] for _ in range(24)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    config = {"policy": "continuous", "num_kv_blocks": 1024, "block_size": 16}
    llm = LLM(tiny_model_dir, native_attention=False, **config)
    kept = [o.token_ids for o in llm.generate(prompts, params)]
    stats = llm.engine.runner.attention.gathers.stats()
    assert stats["decode_steps"] >= 24
    assert 100 * stats["full_gathers"] / stats["decode_steps"] <= 5
    assert stats["row_copies"] > 0, "rows joined and left"
    fresh = LLM(tiny_model_dir, native_attention=False, **config)
    fresh.engine.runner.attention.gathers.budget_bytes = 0  # every row gathered every step
    assert [o.token_ids for o in fresh.generate(prompts, params)] == kept
    paged = LLM(tiny_model_dir, **config)  # the native kernel where it builds: no gather
    assert [o.token_ids for o in paged.generate(prompts, params)] == kept


def test_a_wasteful_single_bucket_splits_moving_rows_not_regathering() -> None:
    """Few rows at first (one bucket); then many short rows join: once re-split, the short
    bucket's buffers narrow to its limit and only moved rows are copied."""
    world = World("torch", seed=5)
    long = [Seq(f"l{i}") for i in range(3)]
    short = [Seq(f"s{i}") for i in range(9)]
    world.step(prefills=[(s, 3 * BLOCK + i) for i, s in enumerate(long)])
    world.step(decodes=long, prefills=[(s, 2 + i) for i, s in enumerate(short)])
    for _ in range(RELAYOUT_STEPS + 1):
        world.step(decodes=long + short)
    gathers = world.backend.gathers
    buckets = gathers._buckets
    assert len(buckets) == 2
    in_short = {s.seq_id for s in buckets[0].slots}
    assert len(in_short) >= 5 and in_short <= {s.seq_id for s in short}
    assert buckets[0].width <= buckets[0].limit + WIDTH_HEADROOM < buckets[1].width
    assert gathers.stats()["full_gathers"] == 1
    assert all(world.kept[1:])


def test_released_buffers_are_freed_and_the_next_step_gathers_afresh() -> None:
    """Issue 23, defect 6: an idle engine frees its gather buffers (they held hundreds of MB
    after a load, for good); the next decode step lays them out again and attends as the
    oracle does."""
    world = World("torch", seed=3)
    seqs = [Seq(str(i)) for i in range(6)]
    world.step(prefills=[(s, 7 + 11 * i) for i, s in enumerate(seqs)])
    world.step(decodes=seqs)
    gathers = world.backend.gathers
    assert gathers.buffer_bytes() > 0
    world.backend.release_buffers()
    assert gathers.buffer_bytes() == 0
    world.step(decodes=seqs)  # checked against the oracle
    assert gathers.stats()["full_gathers"] == 2 and gathers.buffer_bytes() > 0
