"""AsyncEngine around a real LLMEngine whose runner is a stub (no model): ordering, abort on a
cancelled consumer, a failing step, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from engine.batch import ScheduledBatch, StepResult
from engine.config import EngineConfig, EngineLimits
from engine.errors import EngineStepError, EngineStopped
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from serving.async_engine import AsyncEngine
from serving.engine import LLMEngine

TOKEN = 7


class StubRunner:
    """Samples ``TOKEN`` for every sampling row; can be slowed, fail once, or wait at a gate."""

    def __init__(self) -> None:
        self.last_forward_s = 0.0
        self.fail_next = False
        self.delay_s = 0.0
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.gate.wait(10)
        time.sleep(self.delay_s)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("stub forward failed")
        return StepResult([TOKEN for entry in batch.entries if entry.sample])


@pytest.fixture
def runner() -> StubRunner:
    return StubRunner()


@pytest.fixture
def engine(runner: StubRunner) -> Iterator[AsyncEngine]:
    limits = EngineLimits(
        block_size=16,
        num_kv_blocks=64,
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=256,
    )
    config = EngineConfig(model="stub", max_waiting=4)
    finished: list[RequestOutput] = []
    async_engine = AsyncEngine(LLMEngine(config, runner, limits), on_finished=finished.append)
    async_engine.finished = finished  # type: ignore[attr-defined]
    async_engine.start()
    yield async_engine
    async_engine.shutdown()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


async def wait_until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_outputs_arrive_in_order_and_the_stream_ends(engine: AsyncEngine) -> None:
    stream = engine.add_request([1, 2, 3], greedy(4), "r1")
    outputs = [output async for output in stream]
    assert [len(o.token_ids) for o in outputs] == [1, 2, 3, 4]
    assert outputs[-1].finish_reason == "length"
    assert all(o.finish_reason is None for o in outputs[:-1])
    assert [o.request_id for o in engine.finished] == ["r1"]  # type: ignore[attr-defined]


async def test_concurrent_requests_each_get_their_own_outputs(engine: AsyncEngine) -> None:
    streams = [engine.add_request([i, i + 1], greedy(3 + i), f"r{i}") for i in range(3)]

    async def collect(stream) -> list[RequestOutput]:
        return [output async for output in stream]

    results = await asyncio.gather(*(collect(s) for s in streams))
    for i, outputs in enumerate(results):
        assert {o.request_id for o in outputs} == {f"r{i}"}
        assert len(outputs[-1].token_ids) == 3 + i


async def test_cancelled_consumer_aborts_its_request_and_frees_blocks(
    engine: AsyncEngine, runner: StubRunner
) -> None:
    runner.gate.clear()  # the first step hangs: the consumer waits for an output
    stream = engine.add_request(list(range(40)), greedy(400), "long")

    async def consume() -> None:
        async for _ in stream:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    runner.gate.set()
    llm = engine.engine
    await wait_until(lambda: not llm.has_unfinished_requests() and llm.kv_stats().used == 0)
    [final] = engine.finished  # type: ignore[attr-defined]
    assert (final.request_id, final.finish_reason) == ("long", "abort")
    assert len(final.token_ids) < 400


async def test_closing_a_stream_early_aborts_the_request(
    engine: AsyncEngine, runner: StubRunner
) -> None:
    runner.delay_s = 0.005  # 400 tokens would take 2 s
    stream = engine.add_request(list(range(20)), greedy(400), "closed")
    await anext(stream)
    await stream.aclose()
    llm = engine.engine
    await wait_until(lambda: not llm.has_unfinished_requests() and llm.kv_stats().used == 0)
    [final] = engine.finished  # type: ignore[attr-defined]
    assert final.finish_reason == "abort"
    assert len(final.token_ids) < 400
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_failed_step_fails_the_requests_and_the_loop_keeps_serving(
    engine: AsyncEngine, runner: StubRunner
) -> None:
    runner.gate.clear()
    stream = engine.add_request([1, 2, 3], greedy(5), "doomed")
    runner.fail_next = True
    runner.gate.set()
    with pytest.raises(EngineStepError, match="stub forward failed"):
        async for _ in stream:
            pass
    llm = engine.engine
    await wait_until(lambda: not llm.has_unfinished_requests() and llm.kv_stats().used == 0)

    later = [o async for o in engine.add_request([4, 5], greedy(2), "after")]
    assert later[-1].finish_reason == "length"


async def test_shutdown_fails_open_streams(engine: AsyncEngine, runner: StubRunner) -> None:
    runner.gate.clear()
    stream = engine.add_request([1, 2, 3], greedy(5), "cut")
    shutdown = asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
    await asyncio.sleep(0.05)
    runner.gate.set()
    await shutdown
    with pytest.raises(EngineStopped):
        async for _ in stream:
            pass
    with pytest.raises(EngineStopped):
        engine.add_request([1], greedy(1))


async def test_duplicate_request_id_is_rejected(engine: AsyncEngine, runner: StubRunner) -> None:
    from engine.errors import RequestRejected

    runner.gate.clear()
    engine.add_request([1, 2], greedy(3), "same")
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request([1, 2], greedy(3), "same")
    runner.gate.set()


async def test_cut_off_ends_every_stream_at_once_even_mid_step_and_refuses_new_ones(
    engine: AsyncEngine, runner: StubRunner
) -> None:
    """The drain deadline (issue 23, defect 4): every open stream ends with EngineStopped
    while the step in flight hangs, the requests are aborted once it ends, and a request
    after the cut-off is refused the same way."""
    runner.gate.clear()  # the step in flight hangs
    streams = [engine.add_request([1, 2, 3], greedy(400), f"r{i}") for i in range(3)]
    await wait_until(lambda: engine.loop_health().current_step is not None)
    assert engine.cut_off("drain deadline passed") == 3
    for stream in streams:
        with pytest.raises(EngineStopped, match="drain deadline passed"):
            async for _ in stream:
                pass
    with pytest.raises(EngineStopped, match="drain deadline passed"):
        engine.add_request([1], greedy(2), "late")
    runner.gate.set()
    await wait_until(lambda: not engine.engine.has_unfinished_requests())


async def test_memory_trim_runs_once_per_load_when_the_loop_was_idle_twice(
    engine: AsyncEngine,
) -> None:
    from control.jobs.memory_trim import MemoryTrim

    trims: list[int] = []
    trim = MemoryTrim(
        engine.loop_health, engine.engine.release_buffers, lambda: bool(trims.append(1))
    )
    trim.tick()
    trim.tick()
    assert trims == []  # nothing ran yet
    outputs = [output async for output in engine.add_request([1, 2], greedy(3), "r")]
    assert outputs[-1].finished
    await wait_until(lambda: not engine.loop_health().busy)
    trim.tick()
    assert trims == []  # idle once: the last answer may still be written
    trim.tick()
    trim.tick()
    assert trims == [1]  # once for this load
