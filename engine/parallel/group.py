"""The tensor-parallel process group: its rendezvous store, its two groups, its timeouts.

Rank 0 opens a ``TCPStore`` on 127.0.0.1 with a port the OS picks (no race for a free port)
and the worker ranks it spawns connect to it: the ranks are always on one machine, so gloo
talks on loopback (``GLOO_SOCKET_IFNAME=lo`` unless set). Two groups:

- the default group carries the forward's all-reduces: gloo on CPU, NCCL on GPUs, with
  ``COLLECTIVE_TIMEOUT_S``: a rank that stops answering ends the step with an error, never a
  hang;
- ``messages``, a gloo group (the batch is host data), carries rank 0's per-step message. A
  worker waits there between steps for as long as the engine is idle, so its side of the
  group has a long timeout (``IDLE_TIMEOUT``; a rank 0 that dies closes its sockets and ends
  the wait at once); rank 0's side has ``COLLECTIVE_TIMEOUT_S`` (a gloo send waits for the
  receiver, so a stuck worker would otherwise hold rank 0's broadcast forever). A group's
  timeout is each process's own setting.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = float(os.environ.get("SERVEDECK_TP_TIMEOUT_S", "60"))
"""How long a collective of the forward waits for the other ranks (env overrides)."""
STARTUP_TIMEOUT_S = float(os.environ.get("SERVEDECK_TP_STARTUP_TIMEOUT_S", "900"))
"""How long rank 0 waits for the workers to load their shards (a big checkpoint is slow)."""
IDLE_TIMEOUT = timedelta(days=365)
HOST = "127.0.0.1"


def rank_device(device: str, rank: int) -> str:
    """Rank ``rank``'s device: the CPU for every rank, ``cuda:i + rank`` on GPUs."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return device
    return f"cuda:{(dev.index or 0) + rank}"


def open_store(rank: int, world_size: int, port: int = 0) -> dist.TCPStore:
    """Rank 0 hosts the store (``port`` 0: the OS picks, read ``store.port``); the others
    connect to it."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return dist.TCPStore(
        HOST,
        port,
        world_size,
        is_master=rank == 0,
        timeout=timedelta(seconds=STARTUP_TIMEOUT_S),
        wait_for_workers=False,
    )


def init_group(store: dist.TCPStore, rank: int, world_size: int, device: str) -> dist.ProcessGroup:
    """Join the default group (the forward's collectives) and return the messages group."""
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl" if dev.type == "cuda" else "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    group: dist.ProcessGroup = dist.new_group(  # new_group is unannotated in torch (Any)
        backend="gloo", timeout=timeout if rank == 0 else IDLE_TIMEOUT
    )
    return group


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
