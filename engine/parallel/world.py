"""Rank 0's handle on the worker ranks: start them, broadcast each step, stop them.

Rank 0 is the process that builds the engine: it owns the scheduler (the whole ``LLMEngine``)
and rank 0 of the model. ``TensorParallelWorld.start`` spawns ranks 1..K-1
(``torch.multiprocessing``, spawn start method: a script that builds such an engine needs the
usual ``if __name__ == "__main__":`` guard), ``join`` waits until each has loaded its shard
and forms the group; ``close`` (``LLM.close``, or at exit) stops them. A worker that dies
ends the engine: the step in flight fails on its collective (closed socket, or
``COLLECTIVE_TIMEOUT_S``) and every later step raises ``TensorParallelError`` at once.

The ranks form torch.distributed's default process group, which a process has one of: one
tensor-parallel engine per process at a time (a second is refused until the first is closed;
engines built around the same loaded bundle, one after another as the benchmark does, share
its ranks: each ``build_runner`` has them build a fresh KV pool, and they serve the latest).
"""

from __future__ import annotations

import atexit
import contextlib
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.parallel import worker
from engine.parallel.group import STARTUP_TIMEOUT_S, close_group, init_group, open_store
from engine.parallel.messages import BuildRunner, StepMessage, Stop, send
from engine.parallel.shard import Shard
from engine.parallel.worker import RankLoader
from kernels.attention import AttentionInputs

STOP_TIMEOUT_S = 10.0
"""How long ``close`` waits for a worker to leave before it terminates it."""


class TensorParallelError(RuntimeError):
    """A worker rank failed to start or died; the engine cannot step without it."""


class TensorParallelWorld:
    def __init__(self, config: EngineConfig, load: RankLoader) -> None:
        """Spawn the worker ranks; they start loading their shards at once, each with
        ``load`` (the builder's, handed down: nothing here imports the builder)."""
        if dist.is_initialized():
            raise TensorParallelError(
                "this process already has a torch.distributed process group (another "
                "tensor-parallel engine still open?): close that LLM first"
            )
        self.world_size = config.tensor_parallel_size
        device = torch.device(config.device)
        if device.type == "cuda" and (device.index or 0) + self.world_size > (
            count := torch.cuda.device_count()
        ):
            raise ValueError(
                f"tensor_parallel_size={self.world_size} needs {self.world_size} GPUs from "
                f"{device}, one per rank; this machine has {count}"
            )
        self.shard = Shard(0, self.world_size)
        self.store = open_store(0, self.world_size)
        self.failure: str | None = None
        self.messages: dist.ProcessGroup | None = None
        self.closed = False
        context = mp.get_context("spawn")
        args = (self.world_size, self.store.port, config, load, torch.get_num_threads())
        self.processes: list[BaseProcess] = [
            context.Process(
                target=worker.run,
                args=(rank, *args),
                name=f"servedeck-tp-rank{rank}",
                daemon=True,
            )
            for rank in range(1, self.world_size)
        ]
        atexit.register(self.close)
        for process in self.processes:
            process.start()
        self._sentinels = [p.sentinel for p in self.processes]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def join(self, device: str) -> None:
        """Wait until every worker has loaded its shard, then form the groups with them."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pending = set(range(1, self.world_size))
        while pending:
            for rank in sorted(pending):
                if self.store.check([f"error/{rank}"]):
                    error = self.store.get(f"error/{rank}").decode()
                    raise TensorParallelError(
                        f"tensor-parallel rank {rank} failed to load:\n{error}"
                    )
                if self.store.check([f"loaded/{rank}"]):
                    pending.discard(rank)
                elif (code := self.processes[rank - 1].exitcode) is not None:
                    raise TensorParallelError(
                        f"tensor-parallel rank {rank} exited with code {code} before it loaded "
                        "(its stderr says why; a script that builds a tensor-parallel engine "
                        "must do so under `if __name__ == '__main__':`)"
                    )
            if pending and time.monotonic() > deadline:
                raise TensorParallelError(
                    f"tensor-parallel ranks {sorted(pending)} did not load within "
                    f"{STARTUP_TIMEOUT_S:.0f} s (SERVEDECK_TP_STARTUP_TIMEOUT_S)"
                )
            time.sleep(0.02)
        self.messages = init_group(self.store, 0, self.world_size, device)

    def build_runner(self, config: EngineConfig) -> None:
        """Every worker builds a fresh KV pool and runner like rank 0's (``config`` names the
        number of blocks rank 0 chose)."""
        self._send(BuildRunner(config))

    def broadcast_step(
        self,
        block_copies: list[tuple[int, int]],
        input_ids: list[int],
        positions: list[int],
        attention: AttentionInputs,
    ) -> None:
        """The runner's hook: every rank runs this step's forward with rank 0."""
        self._send(StepMessage(block_copies, input_ids, positions, attention))

    def _send(self, message: BuildRunner | StepMessage) -> None:
        self.check_alive()
        assert self.messages is not None, "join() first"
        try:
            send(message, self.messages)
        except RuntimeError as exc:  # a rank went away mid-send: name it if it has exited
            wait(self._sentinels, 1.0)
            self.check_alive()
            self.failure = f"a tensor-parallel rank stopped answering ({exc})"
            raise TensorParallelError(self.failure) from exc

    def check_alive(self) -> None:
        """Raise ``TensorParallelError`` once a worker has exited (or the world was closed).

        A process's sentinel turns readable when it ends, whoever reaps it (``exitcode``
        alone stays None if something else in the process reaped the child)."""
        if self.failure is None and self.closed:
            self.failure = "the tensor-parallel ranks were stopped (the LLM was closed)"
        if self.failure is None and (ended := wait(self._sentinels, 0)):
            rank = next(r for r, s in enumerate(self._sentinels, 1) if s in ended)
            code = self.processes[rank - 1].exitcode
            self.failure = f"tensor-parallel rank {rank} exited" + (
                "" if code is None else f" with code {code}"
            )
        if self.failure is not None:
            raise TensorParallelError(f"{self.failure}; the engine cannot step without it")

    def close(self) -> None:
        """Stop the workers (a ``Stop`` message, then terminate any that linger) and leave
        the group. Idempotent; also runs at interpreter exit."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        alive = all(p.exitcode is None for p in self.processes)
        if self.messages is not None and alive:
            with contextlib.suppress(Exception):  # a worker went away: terminated below
                send(Stop(), self.messages)
        wait = STOP_TIMEOUT_S if self.messages is not None else 0.0
        for process in self.processes:
            process.join(wait)
            if process.exitcode is None:
                process.terminate()
                process.join(STOP_TIMEOUT_S)
            if process.exitcode is None:
                process.kill()
                process.join()
        close_group()
