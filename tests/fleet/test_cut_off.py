"""A drain's deadline is enforced by the control plane: once a draining replica's time is up,
the streams still on it end with ``EngineStopped`` naming why, whether or not Ray's controller
has ended the replica yet (on a loaded machine it ended one 20 s late). Streams on other
replicas go on. A stand-in for Ray's response generator; no replica needed."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from control.fleet.local_ray import RayAccess


class Generator:
    """Ray's response generator as a stream sees it: outputs, then nothing for a long time."""

    def __init__(self, texts: list[str]) -> None:
        self.outputs = [SimpleNamespace(text=text, finished=False) for text in texts]
        self.cancelled = False

    async def __anext__(self) -> Any:
        if self.outputs:
            await asyncio.sleep(0.01)
            return self.outputs.pop(0)
        await asyncio.sleep(3600)

    def cancel(self) -> None:
        self.cancelled = True


def stream_on(fleet: Any, replica: str, outputs: list[str]) -> Any:
    from control.fleet.client import FleetStream
    from engine.front import QueuedPrompt
    from engine.sampling_params import SamplingParams

    stream = FleetStream(fleet, QueuedPrompt([1, 2, 3], SamplingParams(), f"req-{replica}"))
    stream._gen, stream.replica = Generator(outputs), replica  # as start() leaves them
    return stream


def test_streams_on_a_replica_past_its_drain_deadline_end_with_the_reason(
    ray_instance: RayAccess,  # skips (or fails in CI) without ray, like every fleet test
) -> None:
    from control.fleet.client import FleetEngine
    from engine.errors import EngineStopped

    async def scenario() -> None:
        fleet = FleetEngine(handle=None, deployment="engine", front=None)  # type: ignore[arg-type]
        draining, other = stream_on(fleet, "r1", ["a"]), stream_on(fleet, "r2", ["x", "y"])
        assert (await draining.__anext__()).text == "a"
        fleet.cut_off("r1", time.monotonic() + 0.3, "stopped by a rolling restart")
        started = time.monotonic()
        with pytest.raises(EngineStopped, match="stopped by a rolling restart"):
            await asyncio.wait_for(draining.__anext__(), 5)  # not cut: a TimeoutError
        assert 0.25 < time.monotonic() - started < 2.0
        assert draining._gen.cancelled  # the replica is told to abort it
        with pytest.raises(StopAsyncIteration):
            await draining.__anext__()
        assert [(await other.__anext__()).text for _ in range(2)] == ["x", "y"]
        assert not other._gen.cancelled

    asyncio.run(scenario())
