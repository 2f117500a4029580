"""Decode gathers kept across steps give the tokens a fresh gather every step gives."""

from __future__ import annotations

import random

import pytest

from engine.sampling_params import SamplingParams
from serving.llm import LLM


def _workload(seed: int = 3) -> tuple[list[list[int]], list[SamplingParams]]:
    """Mixed lengths (two decode buckets), a shared prefix (copy-on-write), pads under
    the padded policies."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 4000) for _ in range(40)]
    prompts = [
        ([*shared, *[rng.randrange(3, 4000) for _ in range(rng.randint(1, 20))]])
        if i % 3 == 0
        else [rng.randrange(3, 4000) for _ in range(rng.randint(1, 180))]
        for i in range(20)
    ]
    params = [
        SamplingParams(max_tokens=rng.randint(10, 40), temperature=0, ignore_eos=True)
        for _ in prompts
    ]
    return prompts, params


def _run(tiny_model_dir, policy: str, keep: bool, num_kv_blocks: int) -> tuple[list, LLM]:
    # The gather path is the one without the native kernel (which reads the pool
    # through the block tables and gathers nothing).
    llm = LLM(
        tiny_model_dir,
        policy=policy,
        num_kv_blocks=num_kv_blocks,
        block_size=16,
        native_attention=False,
    )
    if not keep:
        llm.engine.runner.attention.gathers.budget_bytes = 0
    prompts, params = _workload()
    return [out.token_ids for out in llm.generate(prompts, params)], llm


@pytest.mark.parametrize(
    ("policy", "num_kv_blocks"),
    [("continuous", 512), ("continuous", 40), ("dynamic", 512), ("hybrid", 512)],
)
def test_kept_gathers_give_the_same_tokens(tiny_model_dir, policy, num_kv_blocks):
    fresh, fresh_llm = _run(tiny_model_dir, policy, keep=False, num_kv_blocks=num_kv_blocks)
    kept, kept_llm = _run(tiny_model_dir, policy, keep=True, num_kv_blocks=num_kv_blocks)
    assert kept == fresh
    gathers = kept_llm.engine.runner.attention.gathers
    assert gathers.kept_steps > 0 and gathers.gathered_steps > 0
    assert fresh_llm.engine.runner.attention.gathers.kept_steps == 0
    if num_kv_blocks == 40:
        assert kept_llm.engine.stats.preemptions > 0
