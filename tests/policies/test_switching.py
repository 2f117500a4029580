"""Live policy switching: every ordered pair, switched back and forth while requests run,
loses nothing and changes no token."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.sampling_params import SamplingParams
from serving.llm import LLM

POLICIES = ("static", "dynamic", "continuous", "hybrid")
SWITCH_AT = (3, 9, 16)


def _workload(vocab: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(11)
    return [
        (
            [rng.randrange(3, vocab) for _ in range(rng.randint(1, 160))],
            SamplingParams(max_tokens=rng.randint(8, 40), temperature=0, ignore_eos=True),
        )
        for _ in range(14)
    ]


def _params(policy: str) -> dict:
    """Small padded groups, so a switch lands while a group is mid-flight."""
    return {"max_batch_size": 4} if policy in ("static", "dynamic") else {}


@pytest.fixture(scope="module")
def workload(tiny_model_dir):
    return _workload(4096)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, workload) -> list[list[int]]:
    llm = LLM(tiny_model_dir, num_kv_blocks=512)
    outputs = llm.generate([p for p, _ in workload], [s for _, s in workload])
    return [o.token_ids for o in outputs]


@pytest.mark.parametrize(("first", "second"), list(itertools.permutations(POLICIES, 2)))
def test_switching_mid_flight_keeps_every_token(
    tiny_model_dir, workload, uninterrupted, first, second
):
    llm = LLM(tiny_model_dir, policy=first, num_kv_blocks=512, **_params(first))
    engine = llm.engine
    ids = [engine.add_request(p, s) for p, s in workload[:10]]
    final, step, switches = {}, 0, 0
    while engine.has_unfinished_requests():
        if step in SWITCH_AT:
            target = second if switches % 2 == 0 else first
            engine.set_policy({"name": target, "params": _params(target)}).result()
            assert engine.policy.name == target
            switches += 1
        if step == SWITCH_AT[0] + 1:
            ids += [engine.add_request(p, s) for p, s in workload[10:]]
        for out in engine.step():
            if out.finished:
                assert out.request_id not in final, "a request finished twice"
                final[out.request_id] = out
        step += 1
    assert switches == len(SWITCH_AT), "the run ended before every switch happened"
    assert [final[i].finish_reason for i in ids] == ["length"] * len(ids)
    assert [final[i].token_ids for i in ids] == uninterrupted
    assert engine.stats.preemptions == 0
    assert engine.stats.prompt_tokens <= sum(len(p) for p, _ in workload), (
        "a switch restarted a request: its prompt was computed twice"
    )
    assert engine.kv_stats().used == 0
    engine.blocks.check_integrity()


def test_switch_validates_before_it_queues(tiny_model_dir):
    from pydantic import ValidationError

    llm = LLM(tiny_model_dir, num_kv_blocks=64)
    with pytest.raises(ValidationError):
        llm.engine.set_policy({"name": "dynamic", "params": {"length_window": 0}})
    assert llm.engine.policy.name == "continuous"
