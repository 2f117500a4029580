"""The prefill budget (issue 16, ``max_prefill_tokens``): a step that carries decodes takes at
most that many prefill tokens beside them, decodes are scheduled before any prefill, a step
without decodes takes the whole token budget; the param is validated, capped by the engine's
token budget, editable live, and greedy outputs stay transformers'. The scheduling tests drive
the real engine, policies and blocks with a runner without a model (fast, exact token counts);
the equality tests run the tiny model."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from engine.batch import ScheduledBatch, StepResult
from engine.config import EngineConfig, EngineLimits
from engine.sampling_params import SamplingParams
from policies.continuous import DEFAULT_MAX_PREFILL_TOKENS, ContinuousParams
from policies.hybrid import HybridParams
from policies.registry import as_spec
from policies.spec import default_spec, parse_spec
from serving.engine import LLMEngine
from serving.llm import LLM
from tests.reference import HFReference, assert_same_as_reference, max_tokens_for, mixed_prompts

BUDGETED = ("continuous", "hybrid")
CAP = 24
LIMITS = EngineLimits(
    block_size=16,
    num_kv_blocks=2048,
    max_model_len=1024,
    max_num_seqs=64,
    max_num_batched_tokens=256,
)


class SpyRunner:
    """Samples token 7 for every sampled row; keeps each step's entries as (kind, tokens)."""

    last_forward_s = 0.0

    def __init__(self) -> None:
        self.steps: list[list[tuple[str, int]]] = []

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.steps.append([(e.kind, e.num_new_tokens) for e in batch.entries])
        return StepResult([7 for e in batch.entries if e.sample])


def _batched(policy: str, **params: object) -> dict[str, object]:
    """Hybrid batched from one request on (its single mode never mixes prefill and decode)."""
    return {**params, "single_request_below": 1} if policy == "hybrid" else params


def _requests(count: int = 40, seed: int = 3) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(3, 4000) for _ in range(rng.randint(5, 200))],
            SamplingParams(max_tokens=rng.randint(2, 40), temperature=0, ignore_eos=True),
        )
        for _ in range(count)
    ]


def _engine(policy: str, **params: object) -> tuple[LLMEngine, SpyRunner]:
    runner = SpyRunner()
    config = EngineConfig(model="spy", max_waiting=100_000)
    spec = {"name": policy, "params": _batched(policy, **params)}
    return LLMEngine(config, runner, LIMITS, policy=spec), runner


def _run(engine: LLMEngine, requests, switch_at: int | None = None, switch=None) -> dict:
    ids = [engine.add_request(p, s) for p, s in requests]
    done: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        if steps == switch_at:
            engine.set_policy(as_spec(switch)).result()
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        steps += 1
        assert steps < 5000, "the run stalled"
    return {i: done[i] for i in ids}


def _prefill(step: list[tuple[str, int]]) -> int:
    return sum(n for kind, n in step if kind != "decode")


@pytest.mark.parametrize("policy", BUDGETED)
def test_cap_holds_while_decodes_run_and_decodes_go_first(policy):
    engine, runner = _engine(policy, max_prefill_tokens=CAP)
    _run(engine, _requests())
    with_decodes = [s for s in runner.steps if any(kind == "decode" for kind, _ in s)]
    assert len(with_decodes) > 20
    for step in with_decodes:
        assert _prefill(step) <= CAP, step
        kinds = [kind for kind, _ in step]
        first_prefill = next((i for i, k in enumerate(kinds) if k != "decode"), len(kinds))
        assert "decode" not in kinds[first_prefill:], f"a decode after a prefill: {kinds}"
    assert any(_prefill(s) == CAP for s in with_decodes), "the cap was never used whole"
    # nothing to protect: a step without decodes takes the whole token budget
    first = runner.steps[0]
    assert _prefill(first) == LIMITS.max_num_batched_tokens


@pytest.mark.parametrize("policy", BUDGETED)
def test_adaptive_cap_follows_the_decodes_running(policy):
    """``adaptive_prefill``: beside D decodes a step takes up to max(cap, B - D (B - cap) / N)
    prefill tokens (B = 256, N = 64 here), so more beside few decodes, the cap near a full
    batch; decodes still go first, and it is live-editable back to the fixed cap."""
    engine, runner = _engine(policy, max_prefill_tokens=CAP, adaptive_prefill=True)
    _run(engine, _requests(80, seed=7))
    budget, n = LIMITS.max_num_batched_tokens, LIMITS.max_num_seqs
    with_decodes = [s for s in runner.steps if any(kind == "decode" for kind, _ in s)]
    assert len(with_decodes) > 20
    seen_above = False
    for step in with_decodes:
        decodes = sum(kind == "decode" for kind, _ in step)
        room = max(CAP, budget - decodes * (budget - CAP) // n)
        assert _prefill(step) <= min(room, budget - decodes), (decodes, step)
        seen_above |= _prefill(step) > CAP
    assert seen_above, "the adaptive cap never went above the fixed one"
    fixed, fixed_runner = _engine(policy, max_prefill_tokens=CAP)
    _run(fixed, _requests(80, seed=7))
    assert len(runner.steps) < len(fixed_runner.steps)  # fewer, larger prefill steps


@pytest.mark.parametrize("policy", BUDGETED)
def test_every_running_decode_is_scheduled_each_step(policy):
    """Decodes first: no prefill, however long the queue, takes a running decode's place."""
    engine, runner = _engine(policy, max_prefill_tokens=CAP)
    for prompt, params in _requests(30, seed=5):
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        running = engine.policy.running
        decoding = sum(len(s.token_ids) - s.num_computed_tokens == 1 for s in running)
        engine.step()
        assert sum(kind == "decode" for kind, _ in runner.steps[-1]) == decoding


@pytest.mark.parametrize("policy", BUDGETED)
def test_without_a_cap_prefill_fills_the_step(policy):
    """``null``: the step's token budget only, as before the param existed."""
    engine, runner = _engine(policy, max_prefill_tokens=None)
    _run(engine, _requests())
    with_decodes = [s for s in runner.steps if any(kind == "decode" for kind, _ in s)]
    assert max(_prefill(s) for s in with_decodes) > CAP
    assert all(sum(n for _, n in s) <= LIMITS.max_num_batched_tokens for s in runner.steps)


@pytest.mark.parametrize("policy", BUDGETED)
def test_live_edit_at_a_step_boundary_loses_nothing(policy):
    requests = _requests()
    base, _ = _engine(policy, max_prefill_tokens=None)
    expected = _run(base, requests)
    engine, runner = _engine(policy, max_prefill_tokens=None)
    switch = {"name": policy, "params": _batched(policy, max_prefill_tokens=8)}
    got = _run(engine, requests, switch_at=3, switch=switch)
    assert list(got.values()) == list(expected.values())
    assert engine.policy.snapshot().params["max_prefill_tokens"] == 8
    after = [s for s in runner.steps[3:] if any(kind == "decode" for kind, _ in s)]
    assert after and all(_prefill(s) <= 8 for s in after)


@pytest.mark.parametrize("model", [ContinuousParams, HybridParams])
def test_validation_and_engine_cap(model):
    for bad in (0, -1, 1 << 21):
        with pytest.raises(ValidationError, match="max_prefill_tokens"):
            model.model_validate({"max_prefill_tokens": bad})
    name = "continuous" if model is ContinuousParams else "hybrid"
    with pytest.raises(ValidationError, match="max_num_batched_tokens=256"):
        parse_spec({"name": name, "params": {"max_prefill_tokens": 512}}, LIMITS)
    assert model().max_prefill_tokens == DEFAULT_MAX_PREFILL_TOKENS
    capped = parse_spec({"name": name, "params": {"max_prefill_tokens": 256}}, LIMITS).params
    assert capped.max_prefill_tokens == 256
    # null stands for the step budget in force, the policy's own when it sets one
    own = model(max_prefill_tokens=None, max_num_batched_tokens=128).effective(LIMITS)
    assert own["max_prefill_tokens"] == 128
    assert model(max_prefill_tokens=None).effective(LIMITS)["max_prefill_tokens"] == 256
    # the cap in force is never shown above the step budget (a small engine cap here)
    small = EngineLimits(16, 64, 1024, 8, max_num_batched_tokens=64)
    assert model(max_prefill_tokens=200).effective(small)["max_prefill_tokens"] == 64


def test_cap_above_the_policys_own_budget_is_the_budget():
    engine, runner = _engine("continuous", max_prefill_tokens=200, max_num_batched_tokens=64)
    _run(engine, _requests(20))
    assert max(sum(n for _, n in s) for s in runner.steps) <= 64


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> HFReference:
    return HFReference(tiny_model_dir)


@pytest.mark.parametrize("policy", BUDGETED)
def test_greedy_equal_to_transformers_under_a_small_cap(tiny_model_dir, reference, policy):
    prompts = mixed_prompts(reference.model.config.vocab_size)
    expected = [reference.generate(p, max_tokens_for(i)) for i, p in enumerate(prompts)]
    llm = LLM(tiny_model_dir, policy=policy, **_batched(policy, max_prefill_tokens=16))
    params = [SamplingParams(max_tokens=max_tokens_for(i), temperature=0) for i in range(16)]
    outputs = llm.generate(prompts, params)
    assert_same_as_reference(reference, prompts, expected, outputs)
    first, *rest = llm.engine.stats.steps
    # the first step admits every prompt (its one "decode" is the 1-token prompt's first row)
    assert first.prefill_tokens > 16 and first.decode_tokens <= 1
    assert all(s.prefill_tokens <= 16 for s in rest if s.decode_tokens)


def test_capacity_search_tunes_the_prefill_budget():
    """sim.search tries each budget where a policy has one (above the step budget it is the
    budget); on a per-token cost model only the cap meets a TPOT SLO on bursty arrivals."""
    from sim.cost_model import CostModel, StepShape
    from sim.search import Grid, Slo, format_search, search
    from sim.simulator import SimSetup
    from sim.trace import TraceRequest

    class PerToken(CostModel):
        name = "per-token"

        def step_time(self, shape: StepShape) -> float:
            return 1e-3 * shape.num_tokens

    grid = Grid.of(max_num_seqs="64", max_num_batched_tokens="1024", memory_reserve="0",
                   max_prefill_tokens="64,null,4096")  # fmt: skip
    setup = SimSetup(num_kv_blocks=4096)
    assert grid.policy_params("dynamic", setup) == [{}]

    def trace(rate: float) -> list[TraceRequest]:
        """Bursts of 8: uncapped, the first two decode beside ~1 s prefill steps at any rate."""
        return [TraceRequest((i // 8) * 8 / rate, 400, 20) for i in range(48)]

    slo = Slo.parse("tpot_p99=100ms")
    result = search(trace, PerToken(), ["continuous", "dynamic"], slo, grid, setup)
    budgets = [c.spec.params.model_dump().get("max_prefill_tokens", "-") for c in result.capacities]
    assert budgets == [64, None, 1024, "-"]
    rates = {b: c.rate for b, c in zip(budgets, result.capacities, strict=True)}
    assert rates[64] > 0 and rates[None] == rates[1024] == 0
    assert "max_prefill_tokens=64" in format_search(result)


def test_guardrail_candidates_vary_the_prefill_budget_within_its_bounds():
    from control.guardrail.plan import candidates
    from control.guardrail.schemas import GuardrailConfig, IntRange, KnobBounds, Objectives
    from control.policy.schemas import PolicySettings

    bounds = KnobBounds(max_prefill_tokens=IntRange(min=16, max=4096))
    config = GuardrailConfig(objectives=Objectives(tpot_p99_s=0.1), bounds=bounds)
    current = PolicySettings(
        policy=default_spec("continuous"), memory_reserve=0.1, reclaim_interval_s=60.0
    )
    found = {
        (c.policy.name, c.policy.params.model_dump().get("max_prefill_tokens"))
        for c in candidates(current, config, LIMITS)
    }
    # min, geometric midpoint and max (4,096 lowered to the engine's 256) for both policies
    for name in BUDGETED:
        assert {(name, 16), (name, 64)} <= found
    assert all(v is None or 16 <= v <= 256 for _, v in found)
