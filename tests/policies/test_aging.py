"""Aging (issue 11, defect 4): a request that waited past ``max_wait_s`` since its arrival is
admitted before any newer one, under every policy and across switches. A fake clock (one
second per step) and a runner without a model drive the real engine, policies and blocks."""

from __future__ import annotations

import itertools

import pytest

from engine.batch import ScheduledBatch, StepResult
from engine.config import EngineConfig, EngineLimits
from engine.sampling_params import SamplingParams
from policies.base import DEFAULT_MAX_WAIT_S
from policies.registry import params_schemas
from policies.spec import default_spec
from serving.engine import LLMEngine

POLICIES = ("static", "dynamic", "continuous", "hybrid")
MAX_WAIT_S = 10.0
SLACK_S = 8.0
"""Once overdue, the long prompt still waits for the batch in flight: a short request lives
at most five steps (prefill + four tokens, or a padded group of them)."""
SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LONG_PROMPT = [9] * 300
STEPS = 150


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class EchoRunner:
    last_forward_s = 0.0

    def execute(self, batch: ScheduledBatch) -> StepResult:
        return StepResult([7 for entry in batch.entries if entry.sample])


def _engine(policy: str, max_wait_s: float | None) -> tuple[LLMEngine, Clock]:
    clock = Clock()
    limits = EngineLimits(
        block_size=16,
        num_kv_blocks=1024,
        max_model_len=1024,
        max_num_seqs=2,
        max_num_batched_tokens=512,
    )
    spec = {"name": policy, "params": {"max_wait_s": max_wait_s}}
    config = EngineConfig(model="echo", max_waiting=100_000)
    return LLMEngine(config, EchoRunner(), limits, clock=clock, policy=spec), clock


def _long_prompt_wait(
    policy: str, max_wait_s: float | None, behind: bool, switch_every_step: bool = False
) -> float:
    """A long prompt arrives first, 30 short requests just after it, then one more per step;
    returns how long the long prompt waited before its first step (inf: never within STEPS).

    With ``behind`` the long prompt joins the queue behind the 30, as a switch can leave it
    (a padded-group policy hands its queue over sorted by length)."""
    engine, clock = _engine(policy, max_wait_s)
    if not behind:
        long_id = engine.add_request(LONG_PROMPT, SHORT)
    clock.now = 1.0
    for _ in range(30):
        engine.add_request([5] * 8, SHORT)
    if behind:
        long_id = engine.add_request(LONG_PROMPT, SHORT, arrival_time=0.0)
    cycle = itertools.cycle(POLICIES[POLICIES.index(policy) + 1 :] + POLICIES)
    for _ in range(STEPS):
        clock.now += 1.0
        engine.add_request([5] * 8, SHORT)
        if switch_every_step:
            engine.set_policy({"name": next(cycle), "params": {"max_wait_s": max_wait_s}})
        for out in engine.step():
            if out.request_id == long_id:
                return out.metrics.first_scheduled_time - out.metrics.arrival_time
        seq = engine._sequences.get(long_id)
        if seq is not None and seq.first_scheduled_time is not None:
            return seq.first_scheduled_time - seq.arrival_time
    return float("inf")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_long_prompt_behind_short_traffic_is_admitted_once_overdue(policy):
    assert _long_prompt_wait(policy, MAX_WAIT_S, behind=True) <= MAX_WAIT_S + SLACK_S
    assert _long_prompt_wait(policy, None, behind=True) > 3 * (MAX_WAIT_S + SLACK_S), (
        "without aging the long prompt waits far longer: the scenario tests aging"
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_aging_counts_from_arrival_across_a_switch_every_step(policy):
    """A wait counted from the last switch would never come due here."""
    wait = _long_prompt_wait(policy, MAX_WAIT_S, behind=True, switch_every_step=True)
    assert wait <= MAX_WAIT_S + SLACK_S
    assert _long_prompt_wait(policy, None, behind=True, switch_every_step=True) > 3 * (
        MAX_WAIT_S + SLACK_S
    )


def test_hybrid_no_longer_starves_a_long_prompt_that_arrived_first():
    """Hybrid's length buckets put every short prompt first: without aging it never runs."""
    assert _long_prompt_wait("hybrid", None, behind=False) == float("inf")
    assert _long_prompt_wait("hybrid", MAX_WAIT_S, behind=False) <= MAX_WAIT_S + SLACK_S


def _batches(policy: str, max_wait_s: float | None) -> list[list[tuple[str, int]]]:
    engine, clock = _engine(policy, max_wait_s)
    for i in range(12):
        engine.add_request([5] * (8 + 40 * (i % 3)), SHORT, f"r{i}")
    steps = []
    original = engine.runner.execute

    def record(batch: ScheduledBatch) -> StepResult:
        steps.append([(e.seq.seq_id, e.num_new_tokens) for e in batch.entries])
        return original(batch)

    engine.runner.execute = record  # type: ignore[method-assign]
    while engine.has_unfinished_requests():
        clock.now += 1.0
        engine.step()
    return steps


@pytest.mark.parametrize("policy", POLICIES)
def test_aging_changes_nothing_until_a_request_is_overdue(policy):
    assert _batches(policy, None) == _batches(policy, 1e4)


def test_defaults_on_for_latency_policies_and_off_for_the_article_batchers():
    defaults = {name: default_spec(name).params.max_wait_s for name in POLICIES}
    assert defaults == {
        "static": None,
        "dynamic": None,
        "continuous": DEFAULT_MAX_WAIT_S,
        "hybrid": DEFAULT_MAX_WAIT_S,
    }
    for name, schema in params_schemas().items():
        field = schema["properties"]["max_wait_s"]
        assert "arrival" in field["description"], name
        bounds = next(option for option in field["anyOf"] if option.get("type") == "number")
        assert bounds["exclusiveMinimum"] == 0 and bounds["maximum"] == 86400


def test_an_overdue_request_that_does_not_fit_holds_back_newer_admissions():
    """Continuous, a small pool: two long runners leave room for short requests but not for
    the overdue long prompt. Once it is overdue no newer request is admitted until it is."""
    clock = Clock()
    limits = EngineLimits(16, 30, 1024, 8, 512)
    config = EngineConfig(model="echo", max_waiting=100_000)
    # No prefill cap: the premise is the pool keeping the long prompt out, not the cap's pace.
    params = {"max_wait_s": MAX_WAIT_S, "max_prefill_tokens": None}
    spec = {"name": "continuous", "params": params}
    engine = LLMEngine(config, EchoRunner(), limits, clock=clock, policy=spec)
    hog = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    for _ in range(2):
        engine.add_request([3] * 150, hog, arrival_time=0.0)
    clock.now = 1.0
    engine.add_request([5] * 8, SHORT)
    long_id = engine.add_request(LONG_PROMPT, SHORT, arrival_time=0.0)  # queued behind
    started: dict[str, float] = {}
    arrived: dict[str, float] = {}
    while engine.has_unfinished_requests() and clock.now < 100:
        clock.now += 1.0
        if clock.now < 60:
            engine.add_request([5] * 8, SHORT)
        for out in engine.step():
            started.setdefault(out.request_id, out.metrics.first_scheduled_time)
            arrived[out.request_id] = out.metrics.arrival_time
    overdue_at, long_start = MAX_WAIT_S, started[long_id]
    assert long_start > overdue_at + 2, "the pool really kept it out for a while"
    newer = [r for r, t in started.items() if arrived[r] > 0 and overdue_at + 1 < t < long_start]
    assert newer == [], "no newer request was admitted while the overdue one waited"
    assert any(arrived[r] > 0 and t <= overdue_at for r, t in started.items()), (
        "short requests did fit before it was overdue"
    )
