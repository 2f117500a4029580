"""A batch of prompts is admitted whole or not at all: ``LLMEngine.add_requests`` checks every
prompt, the waiting queue's room for all of them and their ids before it queues any, and
``AsyncEngine.add_requests`` keeps no stream of a refused batch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.errors import QueueFull, RequestRejected
from engine.front import QueuedPrompt
from engine.sampling_params import SamplingParams
from serving.async_engine import AsyncEngine
from serving.engine import LLMEngine

MAX_WAITING = 4
PARAMS = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


@pytest.fixture
def engine(tiny_model_dir: Path) -> LLMEngine:
    config = EngineConfig(model=str(tiny_model_dir), max_waiting=MAX_WAITING, num_threads=1)
    return LLMEngine.from_config(config)


def batch(*ids: str, prompt: list[int] | None = None) -> list[QueuedPrompt]:
    return [QueuedPrompt(prompt or [1, 2, 3], PARAMS, rid) for rid in ids]


def finished(engine: LLMEngine) -> set[str]:
    done: set[str] = set()
    while engine.has_unfinished_requests():
        done |= {out.request_id for out in engine.step() if out.finished}
    return done


def test_a_batch_without_room_for_all_is_refused_and_queues_none(engine: LLMEngine) -> None:
    assert engine.add_requests(batch("a", "b")) == ["a", "b"]
    with pytest.raises(QueueFull, match=r"room for 2 of this batch's 3 prompts.*none was queued"):
        engine.add_requests(batch("c", "d", "e"))
    assert engine.num_waiting == 2
    engine.add_requests(batch("c", "d"))  # exactly the room left
    with pytest.raises(QueueFull, match=r"waiting queue is full \(max_waiting=4\)"):
        engine.add_request([1, 2, 3], PARAMS, "f")  # one request: the batch of one
    assert finished(engine) == {"a", "b", "c", "d"}


def test_one_prompt_that_can_never_be_served_refuses_the_batch(engine: LLMEngine) -> None:
    too_long = QueuedPrompt([5] * engine.front.limits.max_model_len, PARAMS, "long")
    with pytest.raises(RequestRejected, match="prompt 1 of the 3 in the batch") as refused:
        engine.add_requests([*batch("a"), too_long, *batch("b")])
    assert refused.value.param == "prompt"
    with pytest.raises(RequestRejected, match=r"prompt token ids must be in"):
        engine.add_requests(batch("c", prompt=[1, 10**6]))  # one prompt: read as a request
    assert engine.num_waiting == 0 and not engine.has_unfinished_requests()


def test_a_request_id_in_use_or_repeated_refuses_the_batch(engine: LLMEngine) -> None:
    engine.add_requests(batch("a"))
    with pytest.raises(RequestRejected, match="'a' is already in use"):
        engine.add_requests(batch("b", "a"))
    with pytest.raises(RequestRejected, match="'c' is given twice"):
        engine.add_requests(batch("c", "c"))
    assert engine.num_waiting == 1
    assert finished(engine) == {"a"}


@pytest.fixture
def loop_engine(engine: LLMEngine) -> Iterator[AsyncEngine]:
    loop = AsyncEngine(engine)
    loop.start()
    yield loop
    loop.shutdown()


def test_the_async_engine_streams_each_prompt_and_keeps_none_of_a_refused_batch(
    loop_engine: AsyncEngine,
) -> None:
    async def scenario() -> None:
        with pytest.raises(RequestRejected, match="prompt 1 of the 2"):
            loop_engine.add_requests([*batch("a"), *batch("b", prompt=[10**6])])
        with pytest.raises(QueueFull):
            loop_engine.add_requests(batch(*"abcde"))
        streams = loop_engine.add_requests(batch("a", "b"))  # the refused ids are free again
        assert [stream.request_id for stream in streams] == ["a", "b"]
        for stream in streams:
            outputs = [output async for output in stream]
            assert outputs[-1].request_finished and len(outputs[-1].token_ids) == 3
            assert {output.request_id for output in outputs} == {stream.request_id}

    asyncio.run(scenario())
