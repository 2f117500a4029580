"""Requests and commands from other threads while the owner thread steps."""

from __future__ import annotations

import threading

from engine.batch import StepResult
from engine.config import EngineConfig, EngineLimits
from engine.sampling_params import SamplingParams
from serving.engine import LLMEngine


class EchoRunner:
    """A runner that samples token 7 for every entry: the loop without a model."""

    last_forward_s = 0.0

    def execute(self, batch):
        return StepResult([7 for entry in batch.entries if entry.sample])


def _engine() -> LLMEngine:
    limits = EngineLimits(16, 4096, 512, 256, 4096)
    return LLMEngine(EngineConfig(model="echo", max_waiting=1_000_000), EchoRunner(), limits)


def test_adding_requests_while_the_owner_steps_loses_nothing():
    engine = _engine()
    added: list[str] = []
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for _ in range(3000):
                added.append(engine.add_request([1, 2, 3], SamplingParams(max_tokens=2)))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=producer)
    thread.start()
    finished: set[str] = set()
    while thread.is_alive() or engine.has_unfinished_requests():
        finished |= {out.request_id for out in engine.step() if out.finished}
    thread.join()
    assert not errors
    assert finished == set(added) and len(added) == 3000


def test_commands_from_another_thread_apply_at_the_next_step():
    engine = _engine()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=50))
    engine.step()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(f=engine.set_policy("dynamic")))
    thread.start()
    thread.join()
    assert engine.policy.name == "continuous", "not applied until the owner steps"
    engine.step()
    assert engine.policy.name == "dynamic" and result["f"].result(0).name == "dynamic"
