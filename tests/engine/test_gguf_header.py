"""servedeck's GGUF header parser (``engine.model.gguf_header``) reads what ggml-org's
``GGUFReader`` reads: every metadata value of every type, and each tensor's type, shape, offset
and size; tensors filled a slab of rows at a time (``engine.model.gguf_tensors``) equal
``gguf.quants.dequantize`` of the whole tensor; files it cannot read exactly are refused."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

import engine.model.gguf_tensors as gguf_tensors
from engine.errors import CheckpointError
from engine.model.gguf_header import read_header

Q = GGMLQuantizationType
TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)


def _write(path: Path, endianess: GGUFEndian = GGUFEndian.LITTLE) -> Path:
    w = GGUFWriter(str(path), "llama", endianess=endianess)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁wörld")
    w.add_array("t.strings", ["a", "", "日本語", "<|end|>"])
    w.add_array("t.ints", [3, -1, 7])
    w.add_array("t.floats", [0.5, -2.25])
    w.add_array("t.bools", [True, False])
    g = np.random.default_rng(0)
    for i, kind in enumerate(TYPES):
        values = g.standard_normal((70, 64)).astype(np.float32)  # 70 rows: several slabs
        if kind in (Q.F32, Q.F16):
            w.add_tensor(f"w{i}", values.astype(np.float32 if kind == Q.F32 else np.float16))
        else:
            w.add_tensor(f"w{i}", quantize(values, kind), raw_shape=None, raw_dtype=kind)
    w.add_tensor("norm", g.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("gguf-header") / "types.gguf")


def test_metadata_and_tensors_equal_gguf_reader(written):
    header, reader = read_header(written), GGUFReader(written)
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert header.metadata == theirs
    assert header.metadata["t.u64"] == 2**63 + 5 and header.metadata["t.bool"] is True
    assert header.version == 3 and header.data_offset == reader.data_offset
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, t in zip(header.tensors, reader.tensors, strict=True):
        assert ours.tensor_type == t.tensor_type
        assert ours.shape == tuple(reversed(t.shape.tolist()))
        assert (ours.offset, ours.n_bytes, ours.n_elements) == (
            t.data_offset,
            t.n_bytes,
            t.n_elements,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slab_by_slab_equals_whole_dequantize(written, monkeypatch, dtype):
    monkeypatch.setattr(gguf_tensors, "SLAB_BYTES", 16 * 64 * 4)  # 16 rows a slab
    header, reader = read_header(written), GGUFReader(written)
    with open(written, "rb", buffering=0) as file:
        for ours, t in zip(header.tensors, reader.tensors, strict=True):
            whole = dequantize(t.data, t.tensor_type).reshape(ours.shape)
            dst = torch.full(ours.shape, float("nan"), dtype=dtype)
            gguf_tensors.fill_tensor(file, ours, dst, written)
            assert torch.equal(dst, torch.from_numpy(np.array(whole)).to(dtype)), ours.name


def _raw_header(version: int, type_id: int = 0) -> bytes:
    """A GGUF header written by hand: no metadata, one 32-element tensor ``x``."""
    tensor = struct.pack("<Q", 1) + b"x" + struct.pack("<IQIQ", 1, 32, type_id, 0)
    head = b"GGUF" + struct.pack("<IQQ", version, 1, 0) + tensor
    return head + b"\0" * (-len(head) % 32) + b"\0" * 128


def test_the_hand_written_header_reads(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(_raw_header(3))
    (tensor,) = read_header(path).tensors
    assert (tensor.name, tensor.tensor_type, tensor.shape) == ("x", Q.F32, (32,))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_raw_header(1), "is GGUF version 1"),
        (_raw_header(3, type_id=99), "tensor x has unknown type 99"),
        (b"GGML" + _raw_header(3)[4:], "is not a readable GGUF file"),
        (_raw_header(3)[:30], "is not a readable GGUF file"),
        (b"", "is not a readable GGUF file"),
    ],
)
def test_unreadable_headers_are_refused_by_name(tmp_path, data, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=message) as refused:
        read_header(path)
    assert "bad.gguf" in str(refused.value)


def test_big_endian_file_is_refused(tmp_path):
    path = _write(tmp_path / "big-endian.gguf", GGUFEndian.BIG)
    with pytest.raises(CheckpointError, match=r"big-endian\.gguf is a big-endian GGUF file"):
        read_header(path)
