"""Live knobs: lowering a cap under load at a step boundary drains (admits nobody until under
the new cap) and never preempts; every request still finishes with its uninterrupted greedy
text. Raising the memory reserve stops admission, not running sequences."""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.sampling_params import SamplingParams
from serving.engine import LLMEngine
from serving.llm import LLM

SWITCH_AT = 4
Workload = list[tuple[list[int], SamplingParams]]


def _workload(count: int = 20, seed: int = 5) -> Workload:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(3, 4000) for _ in range(rng.randint(10, 120))],
            SamplingParams(max_tokens=rng.randint(10, 30), temperature=0, ignore_eos=True),
        )
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def workload(tiny_model_dir) -> Workload:
    return _workload()


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, workload) -> list[list[int]]:
    llm = LLM(tiny_model_dir, num_kv_blocks=512)
    return [o.token_ids for o in llm.generate([p for p, _ in workload], [s for _, s in workload])]


class Run:
    """Drive an engine step by step, recording for every step whether the policy was draining
    before it and which sequences started running in it."""

    def __init__(self, engine: LLMEngine, workload: Workload) -> None:
        self.engine = engine
        self.ids = [engine.add_request(p, s) for p, s in workload]
        self.final: dict[str, Any] = {}
        self.draining: list[int | None] = []
        self.admitted_while_draining: list[str] = []
        self.running_after_drain: list[int] = []

    def step(self) -> None:
        policy = self.engine.policy
        draining = policy.draining_to
        before = {s.seq_id for s in policy.running}
        for out in self.engine.step():
            if out.finished:
                assert out.request_id not in self.final, "a request finished twice"
                self.final[out.request_id] = out
        after = {s.seq_id for s in self.engine.policy.running}
        self.draining.append(draining)
        if draining is not None:
            self.admitted_while_draining += sorted(after - before)
        elif any(d is not None for d in self.draining):
            self.running_after_drain.append(len(after))

    def until_done(self, switch: dict[str, Any] | None = None, limit: int = 2000) -> None:
        step = 0
        while self.engine.has_unfinished_requests():
            if step == SWITCH_AT and switch is not None:
                self.engine.set_policy(switch).result()
            self.step()
            step += 1
            assert step < limit, "the run stalled"

    def texts(self) -> list[list[int]]:
        return [self.final[i].token_ids for i in self.ids]


LOWERED = [
    ("continuous", {"max_num_seqs": 12}, {"max_num_seqs": 4}, 4),
    ("hybrid", {"max_num_seqs": 12, "single_request_below": 2}, {"max_num_seqs": 4}, 4),
    ("continuous", {"max_num_seqs": 12}, {"max_num_batched_tokens": 6}, 6),
    ("static", {"max_batch_size": 12}, {"max_batch_size": 3}, 3),
    ("dynamic", {"max_batch_size": 12}, {"max_batch_size": 3}, 3),
]


@pytest.mark.parametrize(("policy", "first", "lowered", "cap"), LOWERED)
def test_lowering_a_cap_drains_without_preempting(
    tiny_model_dir, workload, uninterrupted, policy, first, lowered, cap
):
    llm = LLM(tiny_model_dir, policy=policy, num_kv_blocks=512, **first)
    run = Run(llm.engine, workload)
    run.until_done({"name": policy, "params": {**first, **lowered}})
    assert cap in run.draining, "the lowered cap never showed as 'draining to N'"
    assert set(run.draining) == {None, cap}
    assert run.draining[-1] is None
    assert run.admitted_while_draining == [], "admitted a sequence above the new cap"
    assert max(run.running_after_drain) <= cap
    assert llm.engine.stats.preemptions == 0
    assert llm.engine.stats.prompt_tokens <= sum(len(p) for p, _ in workload), "recomputed"
    assert run.texts() == uninterrupted
    assert llm.engine.kv_stats().used == 0
    llm.engine.blocks.check_integrity()


def test_the_state_reports_draining(tiny_model_dir, workload):
    llm = LLM(tiny_model_dir, num_kv_blocks=512, max_num_seqs=8)
    engine = llm.engine
    for prompt, params in workload:
        engine.add_request(prompt, params)
    engine.step()
    assert engine.snapshot().scheduler.draining_to is None
    engine.set_policy({"name": "continuous", "params": {"max_num_seqs": 2}}).result()
    scheduler = engine.snapshot().scheduler
    assert (scheduler.running, scheduler.draining_to) == (8, 2)
    assert engine.snapshot().model_dump()["scheduler"]["draining_to"] == 2


def test_an_adopted_prefill_over_a_lowered_budget_continues_unchunked_off(tiny_model_dir):
    """With chunked prefill off a running prefill longer than the whole (lowered) budget still
    makes progress in chunks; holding it back would stall it, blocks held, for good."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[7 + i % 50 for i in range(300)], [9] * 40, [11] * 30]
    reference = [o.token_ids for o in LLM(tiny_model_dir).generate(prompts, params)]
    llm = LLM(tiny_model_dir, max_num_batched_tokens=64)
    engine = llm.engine
    run = Run(engine, [(p, params) for p in prompts])
    run.step()  # the long prompt has its first 64-token chunk
    assert engine.policy.running[0].num_computed_tokens == 64
    lowered = {"max_num_batched_tokens": 16, "enable_chunked_prefill": False}
    engine.set_policy({"name": "continuous", "params": lowered}).result()
    run.until_done(limit=400)
    assert run.texts() == reference
    assert engine.stats.preemptions == 0


def test_hybrid_single_mode_finishes_adopted_sequences_before_admitting(tiny_model_dir):
    """Batched hybrid admits short prompts before older long ones (length buckets); switched
    into single mode, the adopted short ones run one at a time, oldest first, and the older
    long ones wait until none is running: no newcomer takes blocks while they hold theirs."""
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = [[5 + i % 40 for i in range(300)] for _ in range(2)] + [
        [8 + i] * 12 for i in range(6)
    ]
    reference = [o.token_ids for o in LLM(tiny_model_dir).generate(prompts, params)]
    batched = {"max_num_seqs": 4, "single_request_below": 2, "length_window": 64}
    llm = LLM(tiny_model_dir, policy="hybrid", **batched)
    engine = llm.engine
    run = Run(engine, [(p, params) for p in prompts])
    run.step()
    adopted = [s.seq_id for s in engine.policy.running]
    assert adopted == run.ids[2:6], "the short prompts went first"
    engine.set_policy(
        {"name": "hybrid", "params": {**batched, "single_request_below": 64}}
    ).result()
    order: list[str] = []
    while engine.has_unfinished_requests():
        run.step()
        last = engine.stats.steps[-1]
        assert (last.mode, last.num_seqs) == ("hybrid-single", 1)
        order += [i for i in run.final if i not in order]
        assert len(run.draining) < 200, "the run stalled"
    assert run.draining[1:4] == [1, 1, 1]
    assert run.admitted_while_draining == []
    assert order[:4] == adopted, "adopted sequences finish first, oldest first"
    assert run.texts() == reference
    assert engine.stats.preemptions == 0


def test_raising_the_memory_reserve_stops_admission_not_running_sequences(tiny_model_dir):
    """At a step boundary the reserve rises to what is free: running sequences keep growing
    into it, nobody is admitted until enough is free again, nothing is preempted; the reclaim
    sweep's guard evicts only cached prefix blocks, never a live sequence's."""
    rng = random.Random(9)
    work = [
        (
            [rng.randrange(3, 4000) for _ in range(48)],  # 3 blocks, 4 with their output
            SamplingParams(max_tokens=rng.randint(8, 16), temperature=0, ignore_eos=True),
        )
        for _ in range(16)
    ]
    prompts, params = [p for p, _ in work], [s for _, s in work]
    reference = [o.token_ids for o in LLM(tiny_model_dir).generate(prompts, params)]
    llm = LLM(tiny_model_dir, num_kv_blocks=48, memory_reserve=0.0, max_num_seqs=8)
    engine = llm.engine
    run = Run(engine, work)
    run.step()
    blocks = engine.blocks
    held = [s.seq_id for s in engine.policy.running]
    assert (len(held), blocks.num_used) == (8, 24)
    engine.set_memory_reserve(0.5).result()
    assert (blocks.reserved, blocks.admissible) == (24, 0)
    sweep = engine.reclaim().result()
    assert (sweep.freed, sweep.evicted) == (0, 0)
    assert all(blocks.holds(seq_id) for seq_id in held)
    held_back, admitted_into_reserve = 0, []
    while engine.has_unfinished_requests():
        admissible = blocks.admissible
        running = {s.seq_id for s in engine.policy.running}
        run.step()
        new = {s.seq_id for s in engine.policy.running} - running
        if admissible < 3:  # a prompt here needs 3 blocks above the reserve
            held_back += bool(engine.policy.waiting)
            admitted_into_reserve += sorted(new)
        assert len(run.draining) < 1000, "the run stalled"
    assert held_back > 0, "the reserve never held anyone back"
    assert admitted_into_reserve == []
    assert max(s.num_seqs for s in engine.stats.steps) == 8
    assert engine.stats.preemptions == 0
    assert run.texts() == reference
    engine.blocks.check_integrity()
