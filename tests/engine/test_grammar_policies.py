"""Constrained rows under every policy, with a live switch mid-run (issue 28's "In the engine"):
constrained and unconstrained rows together, preemption by recompute forced by a small KV
pool, an ``n`` > 1 fork, prefix caching on (a second wave of the same prompts reuses the first
wave's blocks), and the policy switched while rows are running. Every constrained output is
accepted by its grammar and finishes with ``stop`` where the grammar ends; every request
finishes, and the pool is empty at the end."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.grammar import choice_grammar, json_schema_grammar, regex_grammar
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.engine.test_grammar import LONG_ARRAY, SCHEMAS, valid

POLICIES = ("static", "dynamic", "continuous", "hybrid")
SHARED = list(range(100, 148))
"""A 48-token prefix (three 16-token blocks) every prompt starts with: cached by the first
wave, hit by the second."""
PATTERN = r"[a-c]{2,5}-[0-9]{3}"
CHOICES = ("alpha", "beta", "gamma")


Expect = Callable[[str], None]
"""What a constrained row's text must be (raises if it is not)."""


def wave(first: int) -> list[tuple[list[int], SamplingParams, Expect | None]]:
    """Four constrained requests (one of them ``n`` = 2) and two unconstrained ones. The
    ``n`` = 2 request arrives after the first unconstrained one: the pool's preemption victim
    is the latest arrival (docs/fairness.md), and a constrained row must be among them."""

    def schema_of(schema: dict[str, Any]) -> Expect:
        return lambda text: valid(text, schema)

    def matches(text: str) -> None:
        assert re.fullmatch(PATTERN, text), text

    def one_of(text: str) -> None:
        assert text in CHOICES, text

    nested, long = json_schema_grammar(SCHEMAS["nested"]), json_schema_grammar(LONG_ARRAY)
    regex, choice = regex_grammar(PATTERN), choice_grammar(CHOICES)
    return [
        (
            [*SHARED, first],
            SamplingParams(max_tokens=120, temperature=0.0, constraint=nested),
            schema_of(SCHEMAS["nested"]),
        ),
        (
            [*SHARED, first + 2],
            SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True),
            None,
        ),
        (
            [*SHARED, first + 1],
            SamplingParams(max_tokens=120, temperature=1.0, seed=3, n=2, constraint=long),
            schema_of(LONG_ARRAY),
        ),
        (
            [*SHARED, first + 3],
            SamplingParams(max_tokens=30, temperature=1.0, seed=5, constraint=regex),
            matches,
        ),
        (
            [*SHARED, first + 4],
            SamplingParams(max_tokens=30, temperature=0.0, constraint=choice),
            one_of,
        ),
        ([*SHARED, first + 5], SamplingParams(max_tokens=50, temperature=1.0, seed=9), None),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_constrained_rows_under_a_policy_and_a_live_switch(
    tiny_model_dir: Path, policy: str
) -> None:
    after = POLICIES[(POLICIES.index(policy) + 1) % len(POLICIES)]
    llm = LLM(
        tiny_model_dir,
        policy=policy,
        num_kv_blocks=24,
        memory_reserve=0.0,
        num_threads=1,
        enable_prefix_caching=True,
    )
    engine = llm.engine
    expected: dict[str, Expect | None] = {}
    finished: list[RequestOutput] = []

    def add(requests: list[tuple[list[int], SamplingParams, Expect | None]]) -> None:
        for prompt, params, expect in requests:
            expected[engine.add_request(prompt, params)] = expect

    def step() -> None:
        finished.extend(o for o in engine.step() if o.finished)

    add(wave(200))
    for _ in range(12):
        step()
    switched = engine.set_policy(after)
    step()  # the switch applies at this step's boundary, with rows running
    assert switched.result().name == after and engine.policy.name == after
    assert engine.has_unfinished_requests(), "the switch came after every row had finished"
    add(wave(300))
    while engine.has_unfinished_requests():
        step()

    assert len(finished) == 2 * 7  # six requests a wave, one of them two choices
    for output in finished:
        expect = expected[output.request_id]
        if expect is None:
            assert output.finish_reason in ("stop", "length"), output.error
        else:  # the grammar ended: ``stop``, never ``length``
            assert output.finish_reason == "stop", output.text
            expect(output.text)
    assert engine.policy.num_preemptions > 0, "the pool was large enough not to preempt"
    constrained = [o for o in finished if expected[o.request_id] is not None]
    assert any(o.metrics.num_preemptions for o in constrained), "no constrained row recomputed"
    second = [o for o in finished if o.prompt_token_ids[-1] >= 300]
    assert sum(o.metrics.num_cached_tokens for o in second) > 0, "no prefix was reused"
    assert engine.blocks.num_used == 0
