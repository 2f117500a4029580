"""``BlockTable``: a read-only, live view of one sequence's block table, as the
``BlockManager`` (engine/kv_cache.py) hands it out."""

from __future__ import annotations

from collections import abc
from collections.abc import Iterator
from typing import overload


class BlockTable(abc.Sequence[int]):
    """A read-only, live view of one sequence's block table (what the runner reads as
    ``seq.block_table``). Slices are plain lists."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks: list[int]) -> None:
        self._blocks = blocks

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self._blocks[index]

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self._blocks)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockTable):
            return self._blocks == other._blocks
        return isinstance(other, abc.Sequence) and list(self._blocks) == list(other)

    def __repr__(self) -> str:
        return f"BlockTable({self._blocks!r})"
