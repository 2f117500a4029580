"""A damaged safetensors file is refused with a ``CheckpointError`` naming it, whatever part of
its header is damaged (engine/model/safetensors_file.py); a sound one reads back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import CheckpointError
from engine.model.safetensors_file import SafetensorsFile


def _sound(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(path))
    return path


def _with_header(tmp_path: Path, header: bytes, data: bytes = b"") -> Path:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def test_a_sound_file_reads_back(tmp_path: Path) -> None:
    with SafetensorsFile(_sound(tmp_path)) as f:
        (entry,) = f.entries
        assert torch.equal(f.read(entry), torch.arange(6, dtype=torch.float32).reshape(2, 3))


@pytest.mark.parametrize("cut", [1, 9, 20])
def test_a_file_cut_inside_its_header_is_a_checkpoint_error(tmp_path: Path, cut: int) -> None:
    data = _sound(tmp_path).read_bytes()
    size = int.from_bytes(data[:8], "little")
    assert cut < size
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: 8 + cut])
    with pytest.raises(CheckpointError, match="cut inside its header") as info:
        SafetensorsFile(path)
    assert info.value.path == path


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b'{"a": {"dtype": "F32", "sha', "not JSON"),  # the length counts a cut JSON text
        (b"\xff\xfe{}", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"a": {"dtype": "F32", "shape": [1]}}).encode(), "malformed header entry"),
        (json.dumps({"a": 3}).encode(), "malformed header entry"),
        (
            json.dumps({"a": {"dtype": "F32", "shape": ["1"], "data_offsets": [0, 4]}}).encode(),
            "malformed header entry",
        ),
    ],
)
def test_a_damaged_header_is_a_checkpoint_error(
    tmp_path: Path, header: bytes, message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        SafetensorsFile(_with_header(tmp_path, header, b"\0" * 4))
