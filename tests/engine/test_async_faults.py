"""AsyncEngine around the real tiny model: a request whose sampling row fails gets
``RequestFailed`` on its own stream while its neighbour runs on; the watchdog's view of the
loop (``loop_health``) while idle, busy and stalled (``serving.faults.stall``); the test-only
leak through ``serving.faults``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from engine.config import EngineConfig
from engine.errors import EngineStepError, RequestFailed
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from serving.async_engine import AsyncEngine
from serving.engine import LLMEngine

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
PROMPT = [11, 12, 13, 14, 15]


class FailingRowSampler(Sampler):
    """The real sampler, except that one request's row raises."""

    target = "bad"

    def sample_row(self, logits, seq):
        if seq.seq_id == self.target:
            raise RuntimeError("row exploded")
        return super().sample_row(logits, seq)


@pytest.fixture(scope="module")
def solo(tiny_model_dir) -> list[int]:
    from serving.llm import LLM

    return LLM(tiny_model_dir).generate([PROMPT], GREEDY)[0].token_ids


@pytest.fixture
def engine(tiny_model_dir) -> Iterator[AsyncEngine]:
    llm_engine = LLMEngine.from_config(EngineConfig(model=str(tiny_model_dir)))
    runner = llm_engine.runner
    runner.sampler = FailingRowSampler(runner.sampler.generator)  # type: ignore[attr-defined]
    async_engine = AsyncEngine(llm_engine, idle_wait_s=0.05)
    async_engine.start()
    yield async_engine
    async_engine.shutdown()


async def _collect(stream) -> list:
    return [output async for output in stream]


async def _wait_until(predicate, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_failing_row_fails_only_its_own_stream(engine: AsyncEngine, solo) -> None:
    neighbour = engine.add_request(PROMPT, GREEDY, "good")
    bad = engine.add_request([5] * 30, SamplingParams(max_tokens=8, temperature=0.9), "bad")
    with pytest.raises(RequestFailed, match="row exploded") as info:
        await _collect(bad)
    assert info.value.request_id == "bad" and isinstance(info.value, EngineStepError)
    outputs = await _collect(neighbour)
    assert outputs[-1].finish_reason == "length" and outputs[-1].token_ids == solo
    llm = engine.engine
    await _wait_until(lambda: not llm.has_unfinished_requests())
    assert llm.kv_stats().used == 0


async def test_loop_health_idle_then_busy(engine: AsyncEngine) -> None:
    await asyncio.sleep(0.2)
    idle = engine.loop_health()
    assert idle.alive and not idle.busy and idle.current_step is None
    assert idle.seconds_since_progress < 1.0
    outputs = await _collect(engine.add_request(PROMPT, GREEDY, "r1"))
    after = engine.loop_health()
    assert after.step >= len(outputs) and after.step > idle.step
    assert "between steps" in after.describe()


async def test_a_stalled_step_shows_in_loop_health_and_the_request_then_finishes(
    engine: AsyncEngine, solo
) -> None:
    stream = engine.add_request(PROMPT, GREEDY, "stalled")
    first = await anext(stream)
    stalled = asyncio.wrap_future(engine.stall(1.5))
    await _wait_until(lambda: engine.loop_health().seconds_since_progress > 0.8)
    health = engine.loop_health()
    assert health.alive and health.busy
    assert health.current_step is not None and "stalled" in health.current_step.request_ids
    assert health.current_step.num_seqs == 1
    assert health.describe().startswith(f"step {health.current_step.number}: 1 sequences")
    slept = await stalled
    assert slept >= 1.5
    outputs = [first, *await _collect(stream)]
    assert outputs[-1].token_ids == solo, "the stall delays the request but changes nothing"
    await _wait_until(lambda: engine.loop_health().seconds_since_progress < 0.5)


async def test_leak_through_faults_keeps_blocks_until_reclaim(engine: AsyncEngine) -> None:
    stream = engine.add_request([7] * 40, SamplingParams(max_tokens=200, temperature=0), "leak")
    await anext(stream)
    assert engine.leak("leak") is True
    with pytest.raises(EngineStepError, match="leak"):
        await _collect(stream)
    llm = engine.engine
    await _wait_until(lambda: not llm.has_unfinished_requests())
    assert llm.kv_stats().used > 0, "the leaked blocks stay allocated"
    result = await asyncio.wrap_future(llm.reclaim())
    assert result.freed > 0 and llm.kv_stats().used == 0
