"""A worker rank: load this rank's shard, then run every forward rank 0 broadcasts.

Started by rank 0 (``engine.parallel.world``) with the spawn start method. How it loads its
shard and builds its runner is handed to it (``RankLoader``: the builder's own function, which
pickles by name), so this module never imports the builder that starts it. It reports to the
rendezvous store ``loaded/<rank>`` or ``error/<rank>`` (the traceback, which rank 0 raises),
joins the groups, and loops on messages until ``Stop``. It never samples: after the last
layer's all-reduce every rank holds the same hidden states, and rank 0 turns them into tokens.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.parallel.group import close_group, init_group, open_store, rank_device
from engine.parallel.messages import BuildRunner, StepMessage, Stop, receive
from engine.parallel.shard import Shard

if TYPE_CHECKING:
    from engine.runner import ModelRunner

RankLoader = Callable[[EngineConfig, Shard], Callable[[EngineConfig], "ModelRunner"]]
"""Loads this rank's shard of ``config``'s model and returns what builds a runner around it
(for the KV pool a ``BuildRunner`` message sizes). Picklable: the spawn start method sends it."""


def run(
    rank: int,
    world_size: int,
    port: int,
    config: EngineConfig,
    load: RankLoader,
    num_threads: int,
) -> None:
    """The spawned process's entry point."""
    torch.set_num_threads(num_threads)
    _exit_with_parent()
    store = open_store(rank, world_size, port)
    config = replace(config, device=rank_device(config.device, rank))
    try:
        build_runner = load(config, Shard(rank, world_size))
    except BaseException:
        store.set(f"error/{rank}", traceback.format_exc())
        raise
    store.set(f"loaded/{rank}", "1")
    messages = init_group(store, rank, world_size, config.device)
    runner: ModelRunner | None = None
    try:
        with torch.inference_mode():
            while not isinstance(message := receive(messages), Stop):
                if isinstance(message, BuildRunner):
                    runner = build_runner(replace(message.config, device=config.device))
                elif runner is not None:
                    replay(runner, message)
    finally:
        close_group()


def replay(runner: ModelRunner, message: StepMessage) -> None:
    """Rank 0's forward, on this rank's shard and KV pool (``ModelRunner.execute`` minus the
    sampling)."""
    if message.block_copies:
        runner.attention.copy_blocks(message.block_copies)
    meta = runner.attention.prepare(message.attention)
    device = runner.device
    input_ids = torch.tensor(message.input_ids, dtype=torch.int64, device=device)
    positions = torch.tensor(message.positions, dtype=torch.int64, device=device)
    runner.model(input_ids, positions, runner.attention, meta)


def _exit_with_parent() -> None:
    """A worker whose rank 0 vanished (killed before it could stop it) exits by itself."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="servedeck-tp-parent-watch", daemon=True).start()
