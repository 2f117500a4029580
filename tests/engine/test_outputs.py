"""Outputs are snapshots though built in O(1): an output read long after its step (the request
has grown since, or finished) shows exactly what it showed at its step, as plain values that
compare, serialise, copy and pickle like the eager lists and strings they replace."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest
from pydantic import TypeAdapter

from engine.outputs import RequestMetrics, RequestOutput
from engine.sampling_params import SamplingParams
from serving.llm import LLM


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return LLM(tiny_model_dir, max_model_len=256)


def _stream(
    llm: LLM, prompts: list[str], params: SamplingParams
) -> list[tuple[RequestOutput, dict]]:
    """Every output of a run, each with what its fields were when the step returned it
    (eager copies taken at once); every other output is first read only after the run."""
    engine = llm.engine
    for prompt in prompts:
        engine.add_request(prompt, params)
    seen: list[tuple[RequestOutput, dict]] = []
    while engine.has_unfinished_requests():
        for i, out in enumerate(engine.step()):
            now = (
                {}
                if i % 2
                else {
                    "token_ids": list(out.token_ids),
                    "text": str(out.text),
                    "token_times": list(out.metrics.token_times),
                    "finish_time": out.metrics.finish_time,
                }
            )
            seen.append((out, now))
    return seen


def test_outputs_read_late_are_the_snapshot_of_their_step(llm: LLM) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=5, stop=["e t"])
    seen = _stream(llm, ["The batch scheduler", "Paged attention", "x"], params)
    streamed: dict[str, tuple[list[int], str]] = {}
    for out, now in seen:
        tokens, text = streamed.get(out.request_id, ([], ""))
        tokens, text = tokens + out.new_token_ids, text + out.text_delta
        streamed[out.request_id] = (tokens, text)
        assert out.token_ids == tokens and out.text == text  # read now, after the run
        assert len(out.metrics.token_times) == len(tokens)
        assert out.metrics.token_times == sorted(out.metrics.token_times)
        assert (out.metrics.finish_time is None) == (out.finish_reason is None)
        if now:  # read at its step
            assert now == {
                "token_ids": out.token_ids,
                "text": out.text,
                "token_times": out.metrics.token_times,
                "finish_time": out.metrics.finish_time,
            }
    assert len(streamed) == 3 and any(len(t) > 1 for t, _ in streamed.values())


def test_a_snapshot_is_a_plain_value_not_a_view(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("Paged attention", SamplingParams(max_tokens=6, ignore_eos=True))
    first = engine.step()[0]
    early = RequestOutput.of(engine._sequences[first.request_id], [])
    while engine.has_unfinished_requests():
        last = engine.step()
    final = last[0]
    assert len(first.token_ids) == 1 and len(final.token_ids) == 6
    first.token_ids.append(-1)  # a caller's copy: the request and later outputs are untouched
    assert -1 not in final.token_ids and early.token_ids == final.token_ids[:1]
    assert type(final.token_ids) is list and type(final.text) is str
    as_dict = dataclasses.asdict(final)
    assert as_dict["token_ids"] == final.token_ids and "_seq" not in as_dict
    assert json.loads(json.dumps(as_dict))["metrics"]["token_times"] == final.metrics.token_times
    dumped = TypeAdapter(RequestOutput).dump_python(final)
    assert dumped["text"] == final.text and dumped["metrics"]["token_times"]
    for twin in (pickle.loads(pickle.dumps(final)), copy.copy(final), copy.deepcopy(final)):
        assert twin == final and twin.metrics.tpot == final.metrics.tpot
    assert dataclasses.replace(final, error="x").token_ids == final.token_ids


def test_outputs_built_by_hand_keep_their_values() -> None:
    metrics = RequestMetrics(arrival_time=1.0, token_times=[2.0, 3.0, 5.0])
    out = RequestOutput("r", [1], [7, 8], [8], "ab", "b", None, metrics)
    assert out.token_ids == [7, 8] and out.text == "ab" and metrics.tpot == 1.5
    assert RequestMetrics(arrival_time=0.0).token_times == []
    assert [f.name for f in dataclasses.fields(RequestOutput)][:5] == [
        "request_id",
        "prompt_token_ids",
        "token_ids",
        "new_token_ids",
        "text",
    ]
