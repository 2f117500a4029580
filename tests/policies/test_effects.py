"""The article's effects, shown by counting steps and slots rather than timing."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from engine.sampling_params import SamplingParams
from policies.spec import parse_spec
from serving.llm import LLM


def _mixed_workload(n: int = 24, seed: int = 5) -> list[tuple[list[int], SamplingParams]]:
    """Prompts of 8–200 tokens, outputs of 8–128 tokens."""
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(3, 4000) for _ in range(rng.randint(8, 200))],
            SamplingParams(max_tokens=rng.randint(8, 128), temperature=0, ignore_eos=True),
        )
        for _ in range(n)
    ]


def _run(tiny_model_dir, policy: str, workload, **kwargs) -> LLM:
    llm = LLM(tiny_model_dir, policy=policy, num_kv_blocks=1024, **kwargs)
    llm.generate([p for p, _ in workload], [s for _, s in workload])
    return llm


@pytest.fixture(scope="module")
def mixed_runs(tiny_model_dir) -> dict[str, LLM]:
    workload = _mixed_workload()
    return {
        "continuous": _run(tiny_model_dir, "continuous", workload),
        "static": _run(tiny_model_dir, "static", workload, max_batch_size=8),
        "dynamic": _run(tiny_model_dir, "dynamic", workload, max_batch_size=8),
    }


def _slots_per_stored_token(llm: LLM) -> float:
    steps = llm.engine.stats.steps
    return sum(s.kv_held_slots for s in steps) / sum(s.kv_live_tokens for s in steps)


@pytest.mark.parametrize("padded", ["static", "dynamic"])
def test_padded_policies_take_more_steps_and_slots_than_continuous(mixed_runs, padded):
    continuous, other = mixed_runs["continuous"].engine.stats, mixed_runs[padded].engine.stats
    assert other.num_steps > continuous.num_steps
    assert _slots_per_stored_token(mixed_runs[padded]) > _slots_per_stored_token(
        mixed_runs["continuous"]
    )
    assert other.padded_tokens > 0 and continuous.padded_tokens == 0
    assert other.generation_tokens == continuous.generation_tokens


def test_continuous_keeps_kv_slots_nearly_full(mixed_runs):
    """Only the last, partly filled block of each sequence is unused."""
    assert 1.0 / _slots_per_stored_token(mixed_runs["continuous"]) > 0.85


def test_dynamic_groups_respect_window_and_size(tiny_model_dir):
    rng = random.Random(9)
    workload = [
        ([3] * rng.randint(1, 400), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        for _ in range(40)
    ]
    llm = LLM(
        tiny_model_dir, policy="dynamic", num_kv_blocks=2048, max_batch_size=6, length_window=50
    )
    engine = llm.engine
    for prompt, params in workload:
        engine.add_request(prompt, params)
    groups, seen = [], 0
    while engine.has_unfinished_requests():
        engine.step()
        policy = engine.policy
        if policy.groups_started != seen:
            seen = policy.groups_started
            groups.append(sorted(s.num_prompt_tokens for s in policy.group))
    assert sum(len(g) for g in groups) == 40
    assert all(len(g) <= 6 for g in groups)
    assert all(g[-1] - g[0] < 50 for g in groups), groups
    assert len(groups) >= 40 // 6 + 1


def test_hybrid_runs_one_at_a_time_below_the_threshold_and_batches_above(tiny_model_dir):
    llm = LLM(tiny_model_dir, policy="hybrid", num_kv_blocks=1024)
    engine = llm.engine
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for _ in range(3):
        engine.add_request([5] * 20, params)
    while engine.has_unfinished_requests():
        engine.step()
    assert {s.num_seqs for s in engine.stats.steps} == {1}
    assert {s.mode for s in engine.stats.steps} == {"hybrid-single"}

    before = engine.stats.num_steps
    for i in range(10):
        staggered = SamplingParams(max_tokens=4 + 3 * i, temperature=0, ignore_eos=True)
        engine.add_request([6 + i] * 20, staggered)
    while engine.has_unfinished_requests():
        engine.step()
    steps = list(engine.stats.steps)[before:]
    batched = [s for s in steps if s.mode == "hybrid-batched"]
    assert batched and max(s.num_seqs for s in batched) > 1
    tail = steps[-10:]
    assert all(s.mode == "hybrid-single" and s.num_seqs == 1 for s in tail), (
        "the tail, below the threshold again, runs one request at a time"
    )


@pytest.mark.parametrize(("policy", "shorts_first"), [("hybrid", True), ("continuous", False)])
def test_short_prompts_overtake_a_long_prefill_only_under_hybrid(
    tiny_model_dir, policy, shorts_first
):
    llm = LLM(tiny_model_dir, policy=policy, num_kv_blocks=1024, max_num_batched_tokens=256)
    engine = llm.engine
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    long_id = engine.add_request([7] * 2000, params)
    short_ids = [engine.add_request([8 + i] * 16, params) for i in range(6)]
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    long_first = final[long_id].metrics.first_token_time
    shorts = [final[i].metrics.first_token_time for i in short_ids]
    if shorts_first:
        assert max(shorts) < long_first
    else:
        assert min(shorts) >= long_first, "FCFS: the shorts wait for the long prefill"


@pytest.mark.parametrize(
    ("spec", "field", "bound"),
    [
        ({"name": "static", "params": {"max_batch_size": 0}}, "max_batch_size", "1"),
        ({"name": "dynamic", "params": {"length_window": -1}}, "length_window", "1"),
        ({"name": "hybrid", "params": {"single_request_below": 65}}, "single_request_below", "64"),
        ({"name": "continuous", "params": {"max_num_seqs": 999}}, "max_num_seqs", "256"),
    ],
)
def test_invalid_params_name_the_field_and_bound(tiny_model_dir, spec, field, bound):
    limits = LLM(tiny_model_dir, num_kv_blocks=64).engine.front.limits
    with pytest.raises(ValidationError) as info:
        parse_spec(spec, limits)
    error = info.value.errors()[0]
    assert error["loc"] == ("params", field)
    assert bound in str(info.value)


def test_unknown_policy_name_is_refused():
    with pytest.raises(ValidationError) as info:
        parse_spec({"name": "fastest"})
    assert info.value.errors()[0]["loc"] == ("name",)
    assert "continuous" in str(info.value)


def test_every_policy_fills_the_same_step_accounting(mixed_runs):
    for name, llm in mixed_runs.items():
        for step in llm.engine.stats.steps:
            assert step.num_seqs > 0, name
            assert step.prefill_tokens + step.decode_tokens + step.padded_tokens > 0, name
            assert step.kv_held_slots >= step.kv_live_tokens > 0, name
