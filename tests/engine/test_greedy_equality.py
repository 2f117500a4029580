"""Greedy decoding equals transformers token for token, under every policy and memory
situation the engine can be in."""

from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.reference import (
    HFReference,
    assert_same_as_reference,
    max_tokens_for,
    mixed_prompts,
)

POLICIES = ("continuous", "static", "dynamic", "hybrid")
CONFIGS = {
    "ample-blocks-bs16": {"block_size": 16},
    "block-size-32": {"block_size": 32},
    "preemption": {"block_size": 16, "num_kv_blocks": 40},
    "chunked-prefill": {"block_size": 16, "max_num_batched_tokens": 64},
}


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> HFReference:
    return HFReference(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(reference) -> list[list[int]]:
    return mixed_prompts(reference.model.config.vocab_size)


@pytest.fixture(scope="module")
def expected(reference, prompts) -> list[list[int]]:
    return [reference.generate(p, max_tokens_for(i)) for i, p in enumerate(prompts)]


def test_reference_outputs_are_not_degenerate(expected):
    """Random weights that repeat one token would hide attention bugs."""
    distinct = [len(set(tokens)) for tokens in expected]
    assert sum(distinct) / len(distinct) > 8, distinct


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_matches_transformers(tiny_model_dir, reference, prompts, expected, policy, config):
    llm = LLM(tiny_model_dir, policy=policy, **CONFIGS[config])
    params = [SamplingParams(max_tokens=max_tokens_for(i), temperature=0) for i in range(16)]
    outputs = llm.generate(prompts, params)
    assert_same_as_reference(reference, prompts, expected, outputs)
    stats = llm.engine.stats
    if config == "preemption" and policy in ("continuous", "hybrid"):
        assert stats.preemptions > 0, "the small pool should have forced preemption"
    if config == "chunked-prefill":
        assert max(s.prefill_tokens for s in stats.steps) > 0
        if policy in ("continuous", "hybrid"):
            assert all(s.prefill_tokens + s.decode_tokens <= 64 for s in stats.steps)
    kv = llm.kv_stats()
    assert kv.used == 0 and kv.live_tokens == 0, "every block is released at the end"
    llm.engine.blocks.check_integrity()
