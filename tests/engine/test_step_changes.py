"""A step's block changes settle as one: a step that fails as a whole leaves the KV books as
they were (admissions undone, nothing half published) and the requests then finish with the
same tokens; a row that fails alone gives back what the step gave it, the others commit."""

from __future__ import annotations

import pytest

from engine.batch import FAILED_TOKEN, ScheduledBatch, StepResult
from engine.sampling_params import SamplingParams
from serving.llm import LLM

POLICIES = ("static", "dynamic", "continuous", "hybrid")
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
SHARED = list(range(100, 140))  # two and a half blocks of 16: a prefix the cache can share
PROMPTS = [SHARED + [7] * n for n in (3, 9, 20)] + [[300 + n for n in range(50)]]


class FaultyRunner:
    """The engine's runner, with one step that raises (``fail_at``) or one request whose
    sampled row fails (``fail_row``)."""

    def __init__(self, inner, fail_at: int | None = None, fail_row: str | None = None) -> None:
        self._inner, self.fail_at, self.fail_row, self.calls = inner, fail_at, fail_row, 0

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the forward exploded")
        result = self._inner.execute(batch)
        rows = [e.seq.seq_id for e in batch.entries if e.sample]
        if self.fail_row not in rows:
            return result
        tokens = list(result.token_ids)
        tokens[rows.index(self.fail_row)] = FAILED_TOKEN
        return StepResult(tokens, {self.fail_row: "row failed"})


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return LLM(tiny_model_dir, max_model_len=256, num_kv_blocks=64)


@pytest.fixture(scope="module")
def reference(llm) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def _run(llm: LLM, runner: FaultyRunner) -> tuple[dict, int]:
    engine = llm.engine
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    final, raised, before = {}, 0, engine.kv_stats()
    engine.runner, inner = runner, engine.runner
    try:
        while engine.has_unfinished_requests():
            try:
                final.update({o.request_id: o for o in engine.step() if o.finished})
            except RuntimeError as exc:
                assert "exploded" in str(exc)
                raised += 1
                engine.blocks.check_integrity()
                if runner.calls == 1:  # the first step admitted requests, and undid it all
                    assert engine.kv_stats() == before
                    assert not engine.policy.running
                    assert all(s.num_computed_tokens == 0 for s in engine.policy.waiting)
    finally:
        engine.runner = inner
    return {i: final[rid] for i, rid in enumerate(ids)}, raised


@pytest.mark.parametrize("fail_at", [1, 2, 4])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_failed_step_changes_no_block_and_no_token(llm, reference, policy, fail_at):
    llm.set_policy(policy)
    outputs, raised = _run(llm, FaultyRunner(llm.engine.runner, fail_at=fail_at))
    assert raised == 1
    assert [outputs[i].token_ids for i in range(len(PROMPTS))] == reference
    assert llm.kv_stats().used == 0
    llm.engine.blocks.check_integrity()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_failed_row_withdraws_its_prefix_and_the_others_commit(llm, reference, policy):
    llm.set_policy(policy)
    engine = llm.engine
    bad = engine.add_request([500 + n for n in range(40)], GREEDY, "bad")
    outputs, _ = _run(llm, FaultyRunner(engine.runner, fail_row=bad))
    assert [outputs[i].token_ids for i in range(len(PROMPTS))] == reference
    assert engine.blocks.match_prefix([500 + n for n in range(40)]) == [], (
        "the failed row's prefix blocks stay offered"
    )
    assert len(engine.blocks.match_prefix(PROMPTS[3])) == 3, "good rows' prefixes are kept"
    assert llm.kv_stats().used == 0
    engine.blocks.check_integrity()


@pytest.mark.parametrize("policy", ["continuous", "hybrid"])
def test_a_request_sharing_a_failed_rows_fresh_prefix_is_requeued_and_recomputed(
    llm, tiny_model_dir, policy
):
    """Continuous batching admits the second request on the first one's prefix in the same
    step; when the first one's row fails, that prefix is not trusted."""
    fresh = [600 + 50 * POLICIES.index(policy) + n for n in range(40)]  # new to llm's cache
    other = LLM(tiny_model_dir, max_model_len=256, num_kv_blocks=64)
    alone = other.generate([[*fresh, 4, 5]], GREEDY)[0].token_ids
    llm.set_policy(policy, **({"single_request_below": 1} if policy == "hybrid" else {}))
    engine = llm.engine
    assert engine.blocks.match_prefix([*fresh, 4, 5]) == []
    bad = engine.add_request([*fresh, 1, 2, 3], GREEDY, "bad-sharer")
    good = engine.add_request([*fresh, 4, 5], GREEDY, "good-sharer")
    runner = FaultyRunner(engine.runner, fail_row=bad)
    engine.runner, inner = runner, engine.runner
    final: dict = {}
    try:
        first = engine.step()
        assert {o.request_id for o in first} == {bad}, "the sharer's first token is dropped"
        assert engine.snapshot().requests[0].state == "waiting"
        while engine.has_unfinished_requests():
            final.update({o.request_id: o for o in engine.step() if o.finished})
    finally:
        engine.runner = inner
    assert final[good].token_ids == alone
    assert engine.stats.prompt_tokens >= 2 * len(fresh), "the sharer's prompt ran again"
    assert llm.kv_stats().used == 0
    engine.blocks.check_integrity()
