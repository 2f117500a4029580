"""One GGUF tensor's values written into a torch tensor, a slab of rows at a time.

Why slabs: a whole tensor dequantized first is a float32 copy beside the weights; for
SmolLM2's 49,152 × 576 embedding that is 108 MiB, 0.4× its bfloat16 model, and ggml-org's
``gguf.quants.dequantize`` doubles it (it keeps each 16-row group's result in a list before
joining them). Here a slab of rows (``SLAB_BYTES`` of float32) is read from the file
(``readinto``: no memory map, whose touched pages would stay resident until it closed),
dequantized and copied into its rows of the destination, cast to the destination's dtype,
so a load holds the model and one slab.
"""

from __future__ import annotations

from io import FileIO
from pathlib import Path

import numpy as np
import torch
from gguf.quants import dequantize

from engine.errors import CheckpointError
from engine.model.gguf_header import TensorInfo

SLAB_BYTES = 1 << 20
"""float32 values dequantized per step (measured on the SmolLM2 load: 1 MiB held the least
and was no slower than 4 or 16 MiB)."""


def fill_tensor(file: FileIO, tensor: TensorInfo, dst: torch.Tensor, part: Path) -> None:
    """Write ``tensor``'s values (read from ``file``, the part ``part``) into ``dst``, a
    contiguous tensor of its shape, of any dtype and on any device."""
    if tensor.n_elements == 0:
        return
    row = tensor.dims[0] if tensor.dims else 1
    rows = tensor.n_elements // row
    row_bytes = tensor.n_bytes // rows
    step = min(rows, max(1, SLAB_BYTES // (4 * row)))
    buffer = np.empty(step * row_bytes, dtype=np.uint8)
    by_row = dst.view(rows, row)
    file.seek(tensor.offset)
    with torch.no_grad():
        for start in range(0, rows, step):
            n = min(step, rows - start)
            raw = buffer[: n * row_bytes]
            _read_exactly(file, raw, tensor, part)
            values = dequantize(raw.reshape(n, row_bytes), tensor.tensor_type)
            by_row[start : start + n].copy_(torch.from_numpy(values))


def read_tensor(file: FileIO, tensor: TensorInfo, part: Path) -> torch.Tensor:
    """``tensor``'s values as a new float32 CPU tensor of its shape."""
    out = torch.empty(tensor.shape, dtype=torch.float32)
    fill_tensor(file, tensor, out, part)
    return out


def _read_exactly(file: FileIO, raw: np.ndarray, tensor: TensorInfo, part: Path) -> None:
    buffer, done = raw.data, 0
    while done < raw.nbytes:
        got = file.readinto(buffer[done:])
        if not got:
            raise CheckpointError(f"{part.name} ends inside {tensor.name}", part)
        done += got
