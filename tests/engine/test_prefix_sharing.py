"""Prompts with a common prefix share its KV blocks and still decode exactly as alone."""

from __future__ import annotations

import random

import pytest

from engine.sampling_params import SamplingParams
from serving.llm import LLM

PREFIX_LEN = 64


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    prefix = [rng.randrange(3, vocab) for _ in range(PREFIX_LEN)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(5 + 3 * i)] for i in range(8)]


def _run_and_peak_blocks(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    engine = llm.engine
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    peak, results = 0, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.token_ids
        peak = max(peak, engine.kv_stats().used)
    return [results[i] for i in ids], peak


@pytest.mark.parametrize("policy", ["continuous", "hybrid"])
def test_shared_prefix_holds_fewer_blocks_with_identical_outputs(tiny_model_dir, policy):
    shared = LLM(tiny_model_dir, policy=policy, enable_prefix_caching=True)
    prompts = _prompts(shared.engine.front.vocab_size)
    with_sharing, shared_peak = _run_and_peak_blocks(shared, prompts)
    private = LLM(tiny_model_dir, policy=policy, enable_prefix_caching=False)
    without_sharing, private_peak = _run_and_peak_blocks(private, prompts)

    assert with_sharing == without_sharing
    full_prefix_blocks = PREFIX_LEN // 16
    # Eight requests in one burst: seven of them reuse the first one's four prefix blocks.
    assert private_peak - shared_peak == 7 * full_prefix_blocks, (shared_peak, private_peak)


def test_prefix_cache_survives_the_request_and_is_reused(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    prompts = _prompts(llm.engine.front.vocab_size)
    first = llm.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0))[0]
    assert first.metrics.num_cached_tokens == 0
    assert llm.kv_stats().cached >= PREFIX_LEN // 16
    again = llm.generate(prompts[1], SamplingParams(max_tokens=4, temperature=0))[0]
    assert again.metrics.num_cached_tokens == PREFIX_LEN
