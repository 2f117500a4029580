"""``n`` > 1: one request, ``n`` sequences forked off its computed prompt (serving/families.py).

Greedy choices equal the solo greedy text under every policy; seeded sampling is reproducible
and choice i draws as a solo request seeded ``seed + i`` would; the prompt's blocks are shared
(fewer KV blocks than ``n`` separate requests, with prefix caching off); an abort frees all
``n``; exactly one output per request says ``request_finished``; preemption keeps it right.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from engine.batch import StepResult
from engine.errors import RequestFailed
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from serving.async_engine import AsyncEngine
from serving.engine import LLMEngine
from serving.llm import LLM

POLICIES = ["continuous", "static", "dynamic", "hybrid"]
PROMPT = list(range(100, 140))  # 40 tokens: 2.5 blocks of 16
BOUNDARY_PROMPT = list(range(200, 248))  # 48 tokens: ends on a block boundary


def make_llm(model_dir: Path, policy: str = "continuous", **kwargs) -> LLM:
    options = {"num_kv_blocks": 64, "num_threads": 1, "enable_prefix_caching": False} | kwargs
    return LLM(model_dir, policy=policy, **options)


def run(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[RequestOutput]:
    request_id = engine.add_request(prompt, params)
    outputs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == request_id]
        engine.blocks.check_integrity()
    return outputs


def finals(outputs: list[RequestOutput]) -> dict[int, RequestOutput]:
    return {o.index: o for o in outputs if o.finished}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("prompt", [PROMPT, BOUNDARY_PROMPT], ids=["mid-block", "boundary"])
def test_greedy_choices_equal_the_solo_greedy_text(
    tiny_model_dir: Path, policy: str, prompt: list[int]
) -> None:
    llm = make_llm(tiny_model_dir, policy)
    solo = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0))[0]
    outputs = run(llm.engine, prompt, SamplingParams(max_tokens=10, temperature=0.0, n=3))
    choices = finals(outputs)
    assert sorted(choices) == [0, 1, 2]
    for choice in choices.values():
        assert choice.token_ids == solo.token_ids
        assert choice.text == solo.text
        assert choice.finish_reason == solo.finish_reason
    assert [o.request_finished for o in outputs].count(True) == 1
    assert outputs[-1].request_finished
    assert llm.engine.blocks.num_used == 0


def test_seeded_choices_are_reproducible_and_draw_as_seed_plus_index(tiny_model_dir: Path) -> None:
    llm = make_llm(tiny_model_dir)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1234, n=3, ignore_eos=True)
    first = finals(run(llm.engine, PROMPT, params))
    again = finals(run(llm.engine, PROMPT, params))
    assert [first[i].token_ids for i in range(3)] == [again[i].token_ids for i in range(3)]
    assert len({tuple(first[i].token_ids) for i in range(3)}) > 1  # not one draw thrice
    for index in range(3):
        solo = SamplingParams(max_tokens=12, temperature=1.0, seed=1234 + index, ignore_eos=True)
        assert finals(run(llm.engine, PROMPT, solo))[0].token_ids == first[index].token_ids


def max_blocks_used(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> int:
    for prompt, params in requests:
        engine.add_request(prompt, params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.blocks.num_used)
    return peak


@pytest.mark.parametrize("prompt", [PROMPT, BOUNDARY_PROMPT], ids=["mid-block", "boundary"])
def test_n_choices_hold_fewer_blocks_than_n_requests(tiny_model_dir: Path, prompt) -> None:
    llm = make_llm(tiny_model_dir)
    assert not llm.engine.blocks.enable_prefix_caching
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    separate = max_blocks_used(llm.engine, [(prompt, params)] * 3)
    forked = max_blocks_used(
        llm.engine, [(prompt, SamplingParams(max_tokens=8, temperature=0.0, n=3, ignore_eos=True))]
    )
    assert separate == 3 * llm.engine.blocks.blocks_for(len(prompt) + 8)
    # the prompt's full blocks are held once; each choice adds its own last block(s)
    assert forked < separate
    full = len(prompt) // 16 - (1 if len(prompt) % 16 == 0 else 0)
    assert forked <= separate - 2 * full


def test_forked_choices_share_the_prompt_blocks(tiny_model_dir: Path) -> None:
    llm = make_llm(tiny_model_dir)
    engine = llm.engine
    request_id = engine.add_request(PROMPT, SamplingParams(max_tokens=20, temperature=0.0, n=3))
    engine.step()  # the prompt, then the fork
    engine.step()  # the children's first tokens
    blocks = engine.blocks
    tables = [blocks.table(s) for s in (request_id, f"{request_id}#1", f"{request_id}#2")]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert all(blocks.ref_count(b) == 3 for b in tables[0][:2])
    assert len({t[2] for t in tables}) == 3  # the partial last block: one copy each


def test_abort_frees_all_choices(tiny_model_dir: Path) -> None:
    llm = make_llm(tiny_model_dir)
    engine = llm.engine
    request_id = engine.add_request(PROMPT, SamplingParams(max_tokens=50, temperature=0.0, n=4))
    for _ in range(3):
        engine.step()
    assert engine.blocks.num_used > 0
    assert len(engine.snapshot().requests) == 4
    aborted = engine.abort(request_id)
    outputs = engine.step()
    assert aborted.result(timeout=5)
    assert sorted(o.index for o in outputs) == [0, 1, 2, 3]
    assert all(o.finish_reason == "abort" for o in outputs)
    assert [o.request_finished for o in outputs] == [False, False, False, True]
    assert engine.blocks.num_used == 0 and not engine.has_unfinished_requests()
    engine.blocks.check_integrity()


def test_abort_before_the_fork_ends_the_request(tiny_model_dir: Path) -> None:
    engine = make_llm(tiny_model_dir).engine
    request_id = engine.add_request(PROMPT, SamplingParams(max_tokens=5, n=3))
    engine.abort(request_id)
    outputs = engine.step()
    assert [(o.index, o.finish_reason, o.request_finished) for o in outputs] == [(0, "abort", True)]
    assert not engine.has_unfinished_requests()


def test_one_token_choices_still_fork(tiny_model_dir: Path) -> None:
    """The first sequence finishes with its first token; the others are forked anyway."""
    engine = make_llm(tiny_model_dir).engine
    outputs = run(engine, PROMPT, SamplingParams(max_tokens=1, temperature=0.0, n=3))
    assert sorted(finals(outputs)) == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in finals(outputs).values()}) == 1
    assert outputs[-1].request_finished and engine.blocks.num_used == 0


def test_choices_survive_preemption(tiny_model_dir: Path) -> None:
    """A pool too small for every choice at once: choices are preempted and recomputed."""
    llm = make_llm(tiny_model_dir, num_kv_blocks=12, memory_reserve=0.0)
    solo = llm.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0.0))[0]
    params = SamplingParams(max_tokens=40, temperature=0.0, n=4, ignore_eos=True)
    outputs = run(llm.engine, PROMPT, params)
    assert llm.engine.policy.num_preemptions > 0
    for choice in finals(outputs).values():
        assert choice.token_ids[: len(solo.token_ids)] == solo.token_ids
    assert llm.engine.blocks.num_used == 0


def test_n_bounds() -> None:
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=17)


def test_a_failed_choice_ends_the_stream_and_frees_the_others(tiny_model_dir: Path) -> None:
    """One choice's sampling row fails: its stream gets the error at once and the request's
    other choices are aborted (nobody reads them any more)."""
    llm = make_llm(tiny_model_dir)
    runner = llm.engine.runner
    sampler = runner.sampler

    def fail_choice_one(logits, seqs):
        result = sampler(logits, seqs)
        failed = {s.seq_id: "injected" for s in seqs if s.seq_id.endswith("#1")}
        return StepResult(result.token_ids, {**result.failed, **failed}, result.logprobs)

    runner.sampler = fail_choice_one
    async_engine = AsyncEngine(llm.engine)
    async_engine.start()

    async def consume() -> list[RequestOutput]:
        params = SamplingParams(max_tokens=200, temperature=0.0, n=3, ignore_eos=True)
        stream = async_engine.add_request(PROMPT, params)
        seen: list[RequestOutput] = []
        with pytest.raises(RequestFailed, match="injected"):
            async for output in stream:
                seen.append(output)
        return seen

    try:
        seen = asyncio.run(consume())
        assert {o.index for o in seen} <= {0, 2} and seen  # choice 1 failed at its first row
        deadline = time.monotonic() + 20
        while llm.engine.has_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not llm.engine.has_unfinished_requests()
        assert llm.engine.kv_stats().used == 0
    finally:
        async_engine.shutdown()


def test_llm_generate_gives_each_prompts_choices_in_order(tiny_model_dir: Path) -> None:
    llm = make_llm(tiny_model_dir)
    params = [
        SamplingParams(max_tokens=6, temperature=0.0),
        SamplingParams(max_tokens=6, temperature=0.0, n=3),
        SamplingParams(max_tokens=4, temperature=0.0),
    ]
    outputs = llm.generate([PROMPT, BOUNDARY_PROMPT, PROMPT[:20]], params)
    assert [o.index for o in outputs] == [0, 0, 1, 2, 0]
    assert len({o.request_id for o in outputs[1:4]}) == 1
    assert [len(o.token_ids) for o in outputs] == [6, 6, 6, 6, 4]
    solo = llm.generate([BOUNDARY_PROMPT], params[0])[0]
    assert all(o.token_ids == solo.token_ids for o in outputs[1:4])
