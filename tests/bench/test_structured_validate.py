"""bench/structured_validate.py's schema set and checker (no model run): ten schemas covering
what the issue names, each one's longest instance valid and exactly ``max_tokens`` bytes, each
compiled by llguidance, 20 distinct subjects a schema, and the verdicts (``length`` fails)."""

from __future__ import annotations

import json

import jsonschema
import llguidance
import pytest

from bench.structured_validate import (
    SCHEMAS,
    TASKS,
    check,
    jobs,
    longest_instance,
    max_tokens,
)
from engine.grammar import grammar_limits, json_schema_grammar


def keywords(schema: object) -> set[str]:
    if isinstance(schema, dict):
        return set(schema) | {k for value in schema.values() for k in keywords(value)}
    if isinstance(schema, list):
        return {k for value in schema for k in keywords(value)}
    return set()


def test_ten_schemas_cover_objects_arrays_enums_bounds() -> None:
    assert len(SCHEMAS) == 10
    used = keywords(list(SCHEMAS.values()))
    assert {"properties", "items", "enum", "required", "minimum", "maximum"} <= used
    nested = [
        name
        for name, schema in SCHEMAS.items()
        if any(sub.get("type") == "object" for sub in schema["properties"].values())
    ]
    assert nested, "no nested object"
    assert any(
        sub.get("type") == "number" for s in SCHEMAS.values() for sub in s["properties"].values()
    )


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_longest_instance_is_valid_and_sets_max_tokens(name: str) -> None:
    schema = SCHEMAS[name]
    instance = longest_instance(schema)
    jsonschema.validate(instance, schema)
    assert max_tokens(schema) == len(json.dumps(instance).encode())
    grammar = json_schema_grammar(schema).grammar
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, limits=grammar_limits()
    )
    assert not failed, messages


def test_twenty_distinct_prompts_a_schema_each_asked_twice() -> None:
    assert set(TASKS) == set(SCHEMAS)
    todo = jobs(20)
    assert len(todo) == 400
    constrained = [j for j in todo if j.constrained]
    assert len(constrained) == 200
    assert len({(j.schema_name, j.subject) for j in constrained}) == 200
    assert {(j.schema_name, j.subject, j.seed) for j in todo if not j.constrained} == {
        (j.schema_name, j.subject, j.seed) for j in constrained
    }


def test_a_verdict_needs_stop_json_and_the_schema() -> None:
    schema = SCHEMAS["person"]
    good = '{"name": "Ann", "age": 30, "employed": true}'
    assert check(good, "stop", schema).ok
    cut = check(good, "length", schema)
    assert cut.valid and not cut.ok, "an answer cut by length fails"
    broken = check('{"name": "Ann", "age": 30', "stop", schema)
    assert not broken.parsed and not broken.ok and broken.error
    wrong = check('{"name": "Ann", "age": 300, "employed": true}', "stop", schema)
    assert wrong.parsed and not wrong.valid and "300" in (wrong.error or "")
    assert not check(None, "stop", schema).parsed
