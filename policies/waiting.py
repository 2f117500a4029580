"""A policy's waiting queue: a deque that counts its changes, so a queue discipline may keep
what it derived from the queue (the fair queue's per-tenant order) until the queue changes."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from engine.sequence import Sequence


class WaitingQueue(deque[Sequence]):
    """``deque`` whose every change bumps ``version`` (the methods the policies use)."""

    def __init__(self, seqs: Iterable[Sequence] = ()) -> None:
        super().__init__(seqs)
        self.version = 0

    def append(self, seq: Sequence) -> None:
        self.version += 1
        super().append(seq)

    def appendleft(self, seq: Sequence) -> None:
        self.version += 1
        super().appendleft(seq)

    def extend(self, seqs: Iterable[Sequence]) -> None:
        self.version += 1
        super().extend(seqs)

    def remove(self, seq: Sequence) -> None:
        self.version += 1
        super().remove(seq)

    def popleft(self) -> Sequence:
        self.version += 1
        return super().popleft()

    def pop(self) -> Sequence:  # type: ignore[override]  # deque.pop takes no index (typeshed does the same)
        self.version += 1
        return super().pop()

    def clear(self) -> None:
        self.version += 1
        super().clear()
