"""Structured output in the engine (engine/grammar.py): a constrained row's tokens follow its
grammar, step by step, so even the tiny random-weight model writes JSON that parses and
validates against its schema, greedy or sampled; the row finishes with ``stop`` where the
grammar ends; an unconstrained neighbour samples as it would alone; ``n`` > 1 choices each
follow their own matcher; a preempted, recomputed row goes on where its grammar was."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from engine import grammar_mask
from engine.errors import RequestRejected
from engine.grammar import (
    GrammarError,
    choice_grammar,
    json_object_grammar,
    json_schema_grammar,
    regex_grammar,
)
from engine.grammar_mask import mask_logits, unpack_bitmask
from engine.sampling_params import GrammarConstraint, SamplingParams
from serving.llm import LLM

PROMPT = list(range(100, 140))
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 6},
                    "zip": {"type": "integer", "minimum": 0, "maximum": 99999},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array_enum_bounds": {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["colour", "age", "tags", "ok"],
        "additionalProperties": False,
    },
}
LONG_ARRAY = {
    "type": "array",
    "items": {"type": "integer", "minimum": 100, "maximum": 999},
    "minItems": 24,
    "maxItems": 24,
}
"""At least 24 numbers: long enough that four choices outgrow a small pool."""


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=64, num_threads=1, enable_prefix_caching=False)


def valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_output_parses_and_validates(llm: LLM, name: str, temperature: float) -> None:
    schema = SCHEMAS[name]
    params = [
        SamplingParams(
            max_tokens=80,
            temperature=temperature,
            seed=seed,
            constraint=json_schema_grammar(schema),
        )
        for seed in range(3)
    ]
    for output in llm.generate([PROMPT, PROMPT[5:], PROMPT[10:]], params):
        assert output.finish_reason == "stop", output.text
        valid(output.text, schema)


def test_regex_and_choice(llm: LLM) -> None:
    pattern = r"[a-c]{2,5}-[0-9]{3}"
    params = [
        SamplingParams(max_tokens=30, temperature=1.0, seed=1, constraint=regex_grammar(pattern)),
        SamplingParams(
            max_tokens=30, temperature=0.0, constraint=choice_grammar(["alpha", "beta"])
        ),
    ]
    regex, choice = llm.generate([PROMPT, PROMPT], params)
    assert re.fullmatch(pattern, regex.text) and regex.finish_reason == "stop"
    assert choice.text in ("alpha", "beta") and choice.finish_reason == "stop"


def test_json_object_gives_an_object(llm: LLM) -> None:
    params = SamplingParams(max_tokens=80, temperature=0.0, constraint=json_object_grammar())
    output = llm.generate([PROMPT], params)[0]
    if output.finish_reason == "stop":  # any object: the random model may write a long one
        assert isinstance(json.loads(output.text), dict)
    else:
        assert output.text.startswith("{")


def test_an_unconstrained_neighbour_samples_as_it_would_alone(llm: LLM) -> None:
    plain = SamplingParams(max_tokens=20, temperature=0.0)
    alone = llm.generate([PROMPT], plain)[0]
    constrained = SamplingParams(
        max_tokens=80, temperature=0.0, constraint=json_schema_grammar(SCHEMAS["nested"])
    )
    together = llm.generate([PROMPT, PROMPT[3:]], [plain, constrained])
    assert together[0].token_ids == alone.token_ids
    valid(together[1].text, SCHEMAS["nested"])


def test_each_choice_follows_its_own_matcher(llm: LLM) -> None:
    schema = SCHEMAS["array_enum_bounds"]
    params = SamplingParams(
        max_tokens=80, temperature=1.0, seed=7, n=3, constraint=json_schema_grammar(schema)
    )
    outputs = llm.generate([PROMPT], params)
    assert len(outputs) == 3
    for output in outputs:
        assert output.finish_reason == "stop"
        valid(output.text, schema)


def test_a_preempted_constrained_row_goes_on_where_its_grammar_was(tiny_model_dir: Path) -> None:
    llm = LLM(tiny_model_dir, num_kv_blocks=12, memory_reserve=0.0, num_threads=1)
    params = SamplingParams(
        max_tokens=120, temperature=0.0, n=4, constraint=json_schema_grammar(LONG_ARRAY)
    )
    outputs = llm.generate([PROMPT], params)
    assert llm.engine.policy.num_preemptions > 0
    for output in outputs:
        assert output.finish_reason == "stop"
        valid(output.text, LONG_ARRAY)
    assert llm.engine.blocks.num_used == 0


def test_a_grammar_that_cannot_compile_is_refused_at_admission(llm: LLM) -> None:
    bad = json_schema_grammar({"type": "array", "uniqueItems": True})
    with pytest.raises(RequestRejected, match="uniqueItems") as caught:
        llm.engine.add_request(PROMPT, SamplingParams(constraint=bad))
    assert caught.value.param == "response_format"
    with pytest.raises(GrammarError):
        json_schema_grammar([1, 2])  # type: ignore[arg-type]  # not an object: refused


def test_a_compile_past_its_deadline_is_stopped_and_refused(llm: LLM) -> None:
    """The first compile runs in a worker process, killed past the deadline; the next check
    starts a new one; a refusal comes back from it as llguidance words it."""
    grammars = llm.engine.front.grammars
    assert grammars is not None
    # ~0.2 s to compile here (2,000 patterned properties): a grammar of a few rules compiles in
    # under the 1 ms deadline whenever a loaded machine pauses this thread after sending it.
    fields = {f"p{i}": {"type": "string", "pattern": "[a-z]{3}-[0-9]{2}"} for i in range(2000)}
    fresh = json_schema_grammar({"type": "object", "properties": fields, "required": [*fields]})
    with pytest.raises(GrammarError, match="took longer than"):
        grammars.compile(fresh, timeout_s=0)  # poll() rounds up to 1 ms
    assert not grammars.is_compiled(fresh)
    grammars.compile(fresh, timeout_s=60)
    assert grammars.is_compiled(fresh)
    with pytest.raises(GrammarError, match="not"):
        grammars.compile(json_schema_grammar({"not": {"type": "string"}}), timeout_s=60)


def test_rows_without_a_grammar_never_reach_the_mask(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("a mask computed for an unconstrained batch")

    monkeypatch.setattr("engine.grammar_mask.compute_masks", fail)
    llm.generate([PROMPT, PROMPT[2:]], SamplingParams(max_tokens=4, temperature=0.0))


def test_the_masks_are_computed_beside_the_forward(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward waits for the step's masks to be computed: it would wait forever (here: 10
    s, then fail) were they computed after it."""
    computed = threading.Event()
    compute = grammar_mask.compute_masks

    def compute_and_tell(*args: Any) -> Any:
        masks = compute(*args)
        computed.set()
        return masks

    runner = llm.engine.runner
    model = runner.model  # type: ignore[attr-defined]

    class WaitingModel:
        def __call__(self, *args: Any) -> Any:
            assert computed.wait(10), "no mask computed while the forward ran"
            computed.clear()
            return model(*args)

        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return model.compute_logits(hidden)

    monkeypatch.setattr(grammar_mask, "compute_masks", compute_and_tell)
    monkeypatch.setattr(runner, "model", WaitingModel())
    params = SamplingParams(max_tokens=80, temperature=0.0, constraint=json_object_grammar())
    output = llm.generate([PROMPT], params)[0]
    assert output.text.startswith("{")


def test_a_state_out_of_step_with_its_output_is_refed(llm: LLM) -> None:
    """The matcher is re-fed the output so far where its count and the output's differ."""
    grammars = llm.engine.front.grammars
    assert grammars is not None
    constraint = json_schema_grammar(SCHEMAS["nested"])
    state = grammars.state(constraint)
    tokenizer = llm.engine.front.tokenizer
    assert tokenizer is not None
    prefix = tokenizer.encode('{"name": "ab', add_special_tokens=False).ids

    class Row:
        grammar = state
        output_token_ids = prefix
        num_output_tokens = len(prefix)

    logits = torch.zeros(1, llm.engine.front.vocab_size or 0)
    assert mask_logits(logits, [(0, state)], [Row()]) == {}  # type: ignore[list-item]
    assert state.consumed == len(prefix)
    allowed = torch.isfinite(logits[0]).nonzero()[:, 0].tolist()
    closing = tokenizer.encode('"', add_special_tokens=False).ids[0]
    assert closing in allowed and len(allowed) < logits.shape[1]


def test_the_bitmask_unpacks_as_llguidance_writes_it() -> None:
    words = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32)
    expected = np.unpackbits(words.numpy().view(np.uint8), bitorder="little").reshape(3, -1)
    assert unpack_bitmask(words, 150).numpy().tolist() == expected[:, :150].astype(bool).tolist()


def test_a_constraint_is_keyed_by_its_grammar() -> None:
    one, two = GrammarConstraint("a"), GrammarConstraint("a", "json_object")
    assert one.key == two.key and one.key != GrammarConstraint("b").key
