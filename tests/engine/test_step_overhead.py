"""The engine's bookkeeping fast paths change nothing: a step that needs no block change (most
decodes) records nothing to undo yet still rolls back exactly, a shared block still copies on
write, and a model-free burst (bench/overhead.py's zero-cost runner) ends every request at its
length with the pool's books sound and every sequence-step counted."""

from __future__ import annotations

import argparse
import time

import pytest

from bench.overhead import POLICIES, build, run
from engine.batch import ScheduledBatch, StepResult
from engine.kv_cache import BlockManager


def _args(**overrides: int | str) -> argparse.Namespace:
    args: dict[str, int | str] = dict(
        requests=40,
        min_prompt=20,
        max_prompt=90,
        output=12,
        block_size=16,
        num_kv_blocks=160,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        seed=3,
        queue="fcfs",
        tenants=1,
    )
    return argparse.Namespace(**{**args, **overrides})


@pytest.mark.parametrize("queue", ["fcfs", "priority", "fair"])
@pytest.mark.parametrize("policy", POLICIES)
def test_zero_cost_burst_finishes_every_request(policy: str, queue: str) -> None:
    engine = build(policy, _args(queue=queue, tenants=7))
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert len(finished) == 40
    assert all(o.finish_reason == "length" and len(o.token_ids) == 12 for o in finished)
    assert engine.stats.seq_steps == sum(s.num_seqs for s in engine.stats.steps)
    engine.blocks.check_integrity()
    assert engine.blocks.num_used == 0


def test_run_counts_seq_steps() -> None:
    steps, seq_steps, wall, cpu = run(build("continuous", _args(requests=5)))
    assert steps > 0 and seq_steps >= 5 * 12 and wall > 0 and cpu >= 0


def test_unchanged_decode_rolls_back_exactly() -> None:
    m = BlockManager(8, 4, 0.0)
    step = m.begin_step()
    step.allocate("a", list(range(6)), 6)
    step.commit({"a": (0, 6)})
    table = list(m.table("a"))
    step = m.begin_step()
    assert step.grow("a", 6, 7)  # inside the held block, unshared: nothing to change
    step.register("a", list(range(7)), 7)  # no new full block
    assert step.rollback(["a"]) == []
    step.commit({})
    assert list(m.table("a")) == table and m.stored_tokens("a") == 6
    m.check_integrity()


def test_shared_block_still_copies_on_write() -> None:
    m = BlockManager(8, 4, 0.0)
    step = m.begin_step()
    step.allocate("a", list(range(6)), 6)
    step.commit({"a": (0, 6)})
    m.fork("a", "b")
    step = m.begin_step()
    assert step.grow("b", 6, 7)  # block 1 is shared with "a": "b" gets a copy
    copies = step.take_copies()
    assert len(copies) == 1 and copies[0][0] == m.table("a")[1]
    assert m.table("b")[1] == copies[0][1] != m.table("a")[1]
    step.rollback()
    assert list(m.table("b")) == list(m.table("a"))
    m.check_integrity()


def test_a_step_records_the_threads_own_cpu_time_apart_from_its_wall_time() -> None:
    """A step whose forward waits (here a sleep: what a wait for the GIL or a core looks like
    to the thread) records the wait in wall time, not CPU time (issue 40, step 4)."""
    engine = build("continuous", _args(requests=3, output=2))
    execute = engine.runner.execute

    def waiting_execute(batch: ScheduledBatch) -> StepResult:
        time.sleep(0.02)
        return execute(batch)

    engine.runner.execute = waiting_execute  # type: ignore[method-assign]
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats
    assert stats.num_steps >= 2
    assert stats.wall_s >= 0.02 * stats.num_steps
    assert 0 < stats.cpu_s < stats.wall_s / 2
    assert stats.cpu_s == pytest.approx(sum(s.cpu_s for s in stats.steps))
