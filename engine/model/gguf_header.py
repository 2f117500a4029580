"""A GGUF file's header as plain Python values: its metadata, and where each tensor's bytes lie.

Why not the ``gguf`` package's ``GGUFReader``: it maps the whole file and keeps every metadata
value as numpy views of that map, two small arrays per string with a dtype object each. On the
shipped SmolLM2 file (49,152 tokens, 48,900 merges) opening it took 6 s and 160 MiB of
anonymous memory, 0.3× the float32 model (0.6× in bfloat16), held for as long as the
checkpoint was open; and every tensor page a load touched stayed resident as the map's
file-backed pages (with whole-tensor dequantization, a served load peaked at 1.78× the
float32 model, 2.56× in bfloat16: ``docs/gguf.md``). Here the header is parsed once
(``struct`` over a map of the file, closed before returning: only the header's pages were
touched) into ``str``/``int``/``float``/``bool`` and lists of them, and tensors are located by
offset, to be read with ``readinto`` (``engine.model.gguf_tensors``): nothing of the file
stays mapped.

The format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), little-endian: the
magic ``GGUF``, a uint32 version (2 or 3: version 1 had 32-bit counts), uint64 tensor and
key-value counts, the key-value pairs (a string key, a uint32 value type, the value; a string
is a uint64 length and UTF-8 bytes; an array, an item type, a uint64 count and the items),
then per tensor its name, a uint32 dimension count, uint64 dimensions (fastest first), a
uint32 ``ggml_type`` and a uint64 offset from the data section, which starts at the next
multiple of ``general.alignment`` (default 32) after the header. A big-endian file (its
version reads as a multiple of 65,536) is refused: its tensor bytes would need swapping.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import TypeAlias

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.errors import CheckpointError

MetadataValue: TypeAlias = "str | int | float | bool | list[MetadataValue]"
MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
V = GGUFValueType
SCALARS = {
    V.UINT8: "B",
    V.INT8: "b",
    V.UINT16: "H",
    V.INT16: "h",
    V.UINT32: "I",
    V.INT32: "i",
    V.FLOAT32: "f",
    V.BOOL: "?",
    V.UINT64: "Q",
    V.INT64: "q",
    V.FLOAT64: "d",
}
"""Value type → its ``struct`` format character (little-endian, no padding)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a GGUF file: its name, type, dimensions and its bytes' place."""

    name: str
    tensor_type: GGMLQuantizationType
    dims: tuple[int, ...]
    """GGUF's order, fastest-varying first (``ne[0]`` is a row's length)."""
    offset: int
    """Absolute position of the tensor's first byte in its file."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions in torch's order (slowest first)."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return prod(self.dims)

    @property
    def n_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.tensor_type]
        return self.n_elements * type_size // block_size


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """A GGUF file's header: its version, metadata and tensors in file order."""

    path: Path
    version: int
    metadata: dict[str, MetadataValue]
    tensors: list[TensorInfo]
    data_offset: int
    """Where the data section starts (tensor offsets are relative to it in the file)."""


class _Cursor:
    """A read position in the header's bytes; reading past the end is a ``struct.error``."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.at = 0

    def scalar(self, fmt: str) -> int | float | bool:
        value: int | float | bool = struct.unpack_from("<" + fmt, self.buffer, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def count(self, fmt: str = "Q") -> int:
        return int(self.scalar(fmt))

    def string(self) -> str:
        size = self.count()
        end = self.at + size
        if end > len(self.buffer):
            raise struct.error(f"a {size}-byte string runs past the end of the file")
        text = self.buffer[self.at : end].decode("utf-8", errors="replace")
        self.at = end
        return text

    def value(self, kind: int) -> MetadataValue:
        if kind == V.STRING:
            return self.string()
        if kind == V.ARRAY:
            item, n = self.count("I"), self.count()
            if item in SCALARS:  # one unpack for the whole array (token types, scores)
                fmt = f"<{n}{SCALARS[V(item)]}"
                items = list(struct.unpack_from(fmt, self.buffer, self.at))
                self.at += struct.calcsize(fmt)
                return items
            return [self.value(item) for _ in range(n)]
        if kind in SCALARS:
            return self.scalar(SCALARS[V(kind)])
        raise ValueError(f"unknown metadata value type {kind}")


def read_header(path: Path) -> GGUFHeader:
    """Parse ``path``'s header; a file that is not GGUF v2/v3, or is cut inside its header,
    is a ``CheckpointError`` naming it."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(path, _Cursor(m))
    except CheckpointError:
        raise
    except (ValueError, struct.error, OSError, OverflowError, MemoryError) as exc:
        raise CheckpointError(
            f"{path.name} is not a readable GGUF file (truncated or corrupt): {exc}", path
        ) from exc


def _parse(path: Path, cursor: _Cursor) -> GGUFHeader:
    if cursor.buffer[:4] != MAGIC:
        raise ValueError("no GGUF magic")
    cursor.at = 4
    version = cursor.count("I")
    if version & 0xFFFF == 0:
        raise CheckpointError(f"{path.name} is a big-endian GGUF file (not supported)", path)
    if version not in VERSIONS:
        raise CheckpointError(f"{path.name} is GGUF version {version} (supported: 2, 3)", path)
    n_tensors, n_fields = cursor.count(), cursor.count()
    metadata: dict[str, MetadataValue] = {}
    for _ in range(n_fields):
        key = cursor.string()
        if key in metadata:
            raise ValueError(f"duplicate metadata key {key}")
        metadata[key] = cursor.value(cursor.count("I"))
    located = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = tuple(cursor.count() for _ in range(cursor.count("I")))
        kind, offset = cursor.count("I"), cursor.count()
        try:
            tensor_type = GGMLQuantizationType(kind)
        except ValueError:
            raise CheckpointError(
                f"{path.name}: tensor {name} has unknown type {kind}", path
            ) from None
        located.append((name, tensor_type, dims, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cursor.at // alignment) * alignment
    tensors = [TensorInfo(n, t, d, data_offset + o) for n, t, d, o in located]
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError("a tensor name appears twice")
    return GGUFHeader(path, version, metadata, tensors, data_offset)
