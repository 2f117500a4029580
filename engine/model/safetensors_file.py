"""Read a safetensors file tensor by tensor, straight into tensors that already exist.

Why not ``safetensors.safe_open``: it maps the file, and every page a ``get_tensor`` touched
stays mapped, so counted in the process's resident memory, until the handle closes: loading a
one-shard bfloat16 checkpoint that way peaked at twice the file size (measured, see
``bench/load_memory.py``). Here the bytes of a tensor are read (``readinto``) into the
parameter's own storage when the dtypes agree, or into one staging tensor of that tensor's
size when they do not (bfloat16 on disk, float32 in the engine: converted tensor by tensor),
so loading never holds more than the model plus its largest tensor.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length,
a JSON header ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}``,
then the data, offsets relative to the end of the header.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import torch

from engine.errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
}
MAX_HEADER_BYTES = 100 << 20
READ_CHUNK = 1 << 30
"""Linux ``read`` returns at most ~2 GiB per call; larger tensors are read in chunks."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """Absolute position of the first byte in the file."""
    nbytes: int


class SafetensorsFile:
    """An open safetensors file; ``entries`` in file order (reads run front to back)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(
                f"missing weights file {self.path.name} in {self.path.parent}", path
            )
        self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        try:
            self.entries = self._read_header()
        except BaseException:
            self._file.close()
            raise

    def _read_header(self) -> list[TensorEntry]:
        size_bytes = self._file.read(8)
        size = int.from_bytes(size_bytes, "little") if len(size_bytes) == 8 else -1
        if not 0 < size <= MAX_HEADER_BYTES:
            raise CheckpointError(f"{self.path.name} is not a safetensors file", self.path)
        raw = self._file.read(size)
        if len(raw) < size:
            raise CheckpointError(f"{self.path.name} is cut inside its header", self.path)
        try:
            header = json.loads(raw)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise CheckpointError(
                f"{self.path.name}: the header is not JSON ({e})", self.path
            ) from e
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path.name}: the header is not a JSON object", self.path)
        header.pop("__metadata__", None)
        file_size = self.path.stat().st_size
        entries = []
        for name, info in header.items():
            try:
                dtype_name, (begin, end), shape = info["dtype"], info["data_offsets"], info["shape"]
                shape = tuple(shape)
                if not all(type(v) is int for v in (begin, end, *shape)):
                    raise TypeError("offsets and shape must be integers")
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(
                    f"{name} in {self.path.name}: a malformed header entry ({e!r})", self.path
                ) from e
            if dtype_name not in DTYPES:
                raise CheckpointError(
                    f"{name} in {self.path.name}: dtype {dtype_name} is not supported",
                    self.path,
                )
            dtype = DTYPES[dtype_name]
            entry = TensorEntry(name, dtype, shape, 8 + size + begin, end - begin)
            expected = math.prod(shape) * dtype.itemsize
            if entry.nbytes != expected or entry.offset + entry.nbytes > file_size:
                raise CheckpointError(f"{name} in {self.path.name}: bad data offsets", self.path)
            entries.append(entry)
        return sorted(entries, key=lambda e: e.offset)

    def read_into(self, entry: TensorEntry, dst: torch.Tensor) -> None:
        """Fill ``dst`` (same shape; any dtype and device) with ``entry``'s values."""
        if tuple(dst.shape) != entry.shape:
            raise CheckpointError(
                f"{entry.name} in {self.path.name}: expected shape {tuple(dst.shape)}, "
                f"got {entry.shape}",
                self.path,
            )
        direct = dst.device.type == "cpu" and dst.dtype == entry.dtype and dst.is_contiguous()
        if direct:
            self._read_bytes(entry, dst)
        else:
            with torch.no_grad():
                dst.copy_(self.read(entry))

    def read(self, entry: TensorEntry) -> torch.Tensor:
        """``entry`` as a new CPU tensor in the file's dtype."""
        tensor = torch.empty(entry.shape, dtype=entry.dtype)
        self._read_bytes(entry, tensor)
        return tensor

    def _read_bytes(self, entry: TensorEntry, dst: torch.Tensor) -> None:
        if entry.nbytes == 0:
            return
        buffer = dst.detach().reshape(-1).view(torch.uint8).numpy().data  # a memoryview
        self._file.seek(entry.offset)
        done = 0
        while done < entry.nbytes:
            got = self._file.readinto(buffer[done : done + READ_CHUNK])
            if not got:
                raise CheckpointError(f"{self.path.name} ends inside {entry.name}", self.path)
            done += got

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
