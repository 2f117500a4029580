"""The allocator setting keeps large freed activations in the heap for the next forward."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from engine.host_memory import retain_freed_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo() -> MallInfo2:
    mallinfo2 = getattr(ctypes.CDLL("libc.so.6"), "mallinfo2", None)
    if mallinfo2 is None:
        pytest.skip("glibc before 2.33 has no mallinfo2")
    mallinfo2.restype = MallInfo2
    return mallinfo2()


def test_large_blocks_come_from_the_heap_and_stay_there_once_freed():
    assert retain_freed_memory()
    size = 20 << 20
    mapped_before = _mallinfo().hblkhd
    block = torch.empty(size // 4)
    block.fill_(1.0)
    assert _mallinfo().hblkhd - mapped_before < size, "a 20 MiB block was mmap'ed on its own"
    del block
    assert _mallinfo().fordblks >= size, "the freed block went back to the kernel"
