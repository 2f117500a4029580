"""What rank 0 tells the worker ranks, one broadcast per message on the messages group.

A step's message is the runner's host-side description of the batch (``StepMessage``: the
copy-on-write block copies, token ids, positions and the ``AttentionInputs`` with slot mapping
and block tables): every rank writes the same slots of its own KV pool, so one set of block
tables serves all. Sampling stays on rank 0, so no sampling rows travel. Messages are pickled
(``broadcast_object_list``: a size, then the bytes); only tensor-parallel engines pay that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from engine.config import EngineConfig
from kernels.attention import AttentionInputs


@dataclass(frozen=True, slots=True)
class BuildRunner:
    """Build a fresh KV pool and runner (rank 0 built its own with this config; the number of
    blocks is rank 0's, so every rank's pool has the same blocks)."""

    config: EngineConfig


@dataclass(frozen=True, slots=True)
class StepMessage:
    """One forward: the same inputs rank 0's runner feeds its model."""

    block_copies: list[tuple[int, int]]
    input_ids: list[int]
    positions: list[int]
    attention: AttentionInputs


@dataclass(frozen=True, slots=True)
class Stop:
    """Leave the loop and the group; the process exits."""


Message = BuildRunner | StepMessage | Stop


def send(message: Message, group: dist.ProcessGroup) -> None:
    dist.broadcast_object_list([message], src=0, group=group)


def receive(group: dist.ProcessGroup) -> Message:
    box: list[Message | None] = [None]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]
