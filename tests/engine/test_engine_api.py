"""The offline API and the step-level engine: limits, stops, sampling, abort, accounting."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import QueueFull, RequestRejected
from engine.sampling_params import SamplingParams
from serving.engine import LLMEngine
from serving.llm import LLM

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return LLM(tiny_model_dir, max_model_len=256)


def _drain(engine: LLMEngine) -> dict:
    final, deltas = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.setdefault(out.request_id, []).append(out.text_delta)
            if out.finished:
                final[out.request_id] = out
    return final, deltas


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("max_tokens", {"max_tokens": 0}),
        ("temperature", {"temperature": -1}),
        ("top_p", {"top_p": 0}),
        ("top_k", {"top_k": -2}),
    ],
)
def test_bad_sampling_params_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_prompt_over_max_model_len_is_refused_naming_the_limit(llm):
    with pytest.raises(RequestRejected, match="max_model_len is 256") as info:
        llm.generate([[5] * 256], GREEDY)
    assert info.value.param == "prompt"


def test_prompt_that_can_never_fit_the_pool_is_refused(tiny_model_dir):
    small_pool = LLM(tiny_model_dir, num_kv_blocks=10, memory_reserve=0.2)
    with pytest.raises(RequestRejected, match="KV pool admits at most 128"):
        small_pool.generate([[5] * 130], GREEDY)
    assert small_pool.generate([[5] * 100], GREEDY)[0].finish_reason == "length"


def test_max_tokens_past_the_context_is_refused_naming_both_numbers(llm):
    too_long = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    with pytest.raises(RequestRejected, match="max_tokens=50 with a prompt of 250") as info:
        llm.generate([[7] * 250], too_long)
    assert info.value.param == "max_tokens" and "max_model_len is 256" in str(info.value)
    with pytest.raises(RequestRejected, match="max_tokens"):
        llm.engine.add_request([7] * 250, too_long)
    exact = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    out = llm.generate([[7] * 250], exact)
    assert len(out[0].token_ids) == 6 and out[0].finish_reason == "length"


def test_bounded_waiting_queue(tiny_model_dir):
    engine = LLMEngine.from_config(EngineConfig(model=str(tiny_model_dir), max_waiting=2))
    engine.add_request([1, 2, 3], GREEDY)
    engine.add_request([1, 2, 3], GREEDY)
    with pytest.raises(QueueFull, match="max_waiting=2"):
        engine.add_request([1, 2, 3], GREEDY)
    _drain(engine)
    engine.add_request([1, 2, 3], GREEDY)


def test_stop_string_truncates_text_and_streams_consistently(llm):
    full = llm.generate("The batch scheduler", GREEDY)[0]
    assert full.text == llm.tokenizer.decode(full.token_ids)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop.strip(), full.text
    engine = llm.engine
    rid = engine.add_request("The batch scheduler", SamplingParams(**{**_greedy(), "stop": [stop]}))
    final, deltas = _drain(engine)
    out = final[rid]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text and full.text.startswith(out.text)
    assert "".join(deltas[rid]) == out.text, "streamed deltas add up to the final text"


def _greedy() -> dict:
    return {"max_tokens": 16, "temperature": 0.0, "ignore_eos": True}


def test_stop_token_ids_and_eos(llm):
    full = llm.generate([[11, 12, 13]], GREEDY)[0].token_ids
    stop_at = full[4]
    first = full.index(stop_at)
    out = llm.generate([[11, 12, 13]], SamplingParams(**_greedy(), stop_token_ids=[stop_at]))[0]
    assert out.token_ids == full[: first + 1] and out.stop_reason == stop_at
    engine = llm.engine
    saved = engine.front.eos_token_ids
    engine.front.eos_token_ids = frozenset({full[2]})
    try:
        eos = llm.generate([[11, 12, 13]], SamplingParams(max_tokens=16, temperature=0))[0]
        ignored = llm.generate([[11, 12, 13]], GREEDY)[0]
    finally:
        engine.front.eos_token_ids = saved
    assert eos.finish_reason == "stop" and eos.token_ids[-1] == full[2]
    assert ignored.token_ids == full


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    alone = llm.generate([[21, 22, 23]], params)[0].token_ids
    others = [SamplingParams(max_tokens=12, temperature=1.0) for _ in range(3)]
    batched = llm.generate([[21, 22, 23], [1] * 40, [2] * 9, [3] * 70], [params, *others])
    assert batched[0].token_ids == alone
    other_seed = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=99)
    assert llm.generate([[21, 22, 23]], other_seed)[0].token_ids != alone


def test_abort_frees_blocks_and_leaves_other_requests_intact(llm):
    engine = llm.engine
    solo = llm.generate([[31] * 40], GREEDY)[0].token_ids
    keep = engine.add_request([31] * 40, GREEDY)
    drop = engine.add_request([32] * 90, SamplingParams(max_tokens=160, temperature=0))
    for _ in range(3):
        engine.step()
    assert engine.abort(drop).result() is True
    final, _ = _drain(engine)
    assert final[drop].finish_reason == "abort"
    assert final[keep].token_ids == solo
    assert engine.kv_stats().used == 0
    assert engine.abort(drop).result() is False, "aborting a finished request is a no-op"


def test_request_metrics_are_ordered(llm):
    out = llm.generate([[41] * 30], GREEDY)[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    assert len(m.token_times) == len(out.token_ids) == 16
    assert 0 <= m.queue_time <= m.ttft <= m.e2e and m.tpot > 0


def test_kv_accounting_while_running(llm):
    engine = llm.engine
    engine.add_request([51] * 40, GREEDY)
    engine.step()
    stats = engine.kv_stats()
    assert stats.used == 3 and stats.live_tokens == 40 and stats.held_slots == 48
    assert stats.utilization == pytest.approx(40 / 48)
    assert stats.free + stats.used + stats.cached == stats.total
    _drain(engine)
    assert engine.kv_stats().used == 0


def test_memory_reserve_and_reclaim_commands(llm):
    with pytest.raises(ValueError, match="memory_reserve"):
        llm.set_memory_reserve(0.6)
    llm.set_memory_reserve(0.15)
    assert llm.kv_stats().reserved == round(0.15 * llm.kv_stats().total + 0.5)
    result = llm.reclaim()
    assert result.freed == 0
    assert llm.engine.snapshot().reclaims[-1].evicted == result.evicted
    llm.set_memory_reserve(0.10)


def test_snapshot_reports_requests_and_policy(llm):
    engine = llm.engine
    rid = engine.add_request([61] * 20, GREEDY)
    snap = engine.snapshot()
    assert snap.policy.name == "continuous" and snap.scheduler.policy == "continuous"
    assert [r.id for r in snap.requests] == [rid]
    assert (snap.queue.waiting, snap.scheduler.waiting) == (1, 1), "queued requests count"
    assert snap.kv == engine.kv_stats()
    assert len(snap.block_map) == snap.kv.total
    with pytest.raises(ValidationError, match="frozen"):
        snap.kv.used = 3
    engine.step()
    row = engine.snapshot().requests[0]
    assert (row.state, row.blocks) == ("running", 2)
    _drain(engine)


def test_snapshot_reports_the_applied_policy_version_and_its_typed_snapshot(tiny_model_dir):
    engine = LLM(tiny_model_dir, max_model_len=256, policy="static").engine
    first = engine.snapshot()
    assert first.policy_version is None and first.scheduler.groups_started == 0
    engine.set_policy({"name": "hybrid"}, version=7).result()
    snap = engine.snapshot()
    assert (snap.policy_version, snap.policy.name, snap.scheduler.mode) == (7, "hybrid", "single")
    dumped = snap.model_dump(mode="json")
    assert dumped["scheduler"]["mode"] == "single" and dumped["kv"]["utilization"] == 0.0
    engine.set_policy("dynamic").result()
    assert engine.snapshot().policy_version is None, "a switch without a version says so"
    assert "group_size" in engine.snapshot().model_dump()["scheduler"]


def test_incremental_detokenizer_handles_multibyte_text(llm):
    tok = llm.tokenizer
    text = "héllo wörld ✓ 日本語 servedeck"
    ids = tok.encode(text).ids
    detok = IncrementalDetokenizer.for_prompt(tok, 1, [])
    pieces = []
    for end in range(2, len(ids) + 1):
        detok.update(ids[:end])
        pieces.append(detok.take_delta(end == len(ids)))
    assert "".join(pieces) == tok.decode(ids[1:])
    assert not any("\ufffd" in piece for piece in pieces)


def test_generate_keeps_prompt_order_for_many_prompts(tiny_model_dir):
    engine_llm = LLM(tiny_model_dir, max_num_seqs=4)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 4000) for _ in range(rng.randint(1, 30))] for _ in range(10)]
    outs = engine_llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0))
    assert [o.prompt_token_ids for o in outs] == prompts
