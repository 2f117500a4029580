"""The native decode attention (kernels/native) against the plain oracle, and its build.

The kernel reads each row only up to its length, so the buffers' padded tail is filled with
NaN here: a read past a row's end would show. Shapes cover every head dim it is built for,
GQA groups past one pass of four heads, lengths of 1, of a 16-lane tail and of the whole span.
"""

from __future__ import annotations

import logging

import pytest
import torch

from kernels import native, reference
from tests.kernels.native_support import native_kernels


def _oracle(query, keys, values, seq_lens, scale):
    """kernels.reference.decode_attention, each row's buffer seen as one block of its own."""
    rows, _, dim = query.shape
    kv_heads, span = keys.shape[0] // rows, keys.shape[1]
    k_cache = keys.view(rows, kv_heads, span, dim).permute(0, 2, 1, 3)
    v_cache = values.view(rows, kv_heads, span, dim).permute(0, 2, 1, 3)
    tables = torch.arange(rows)[:, None]
    return reference.decode_attention(
        query, k_cache, v_cache, tables, seq_lens.to(torch.int32), scale
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(4, 4, 16), (9, 3, 64), (14, 2, 64), (8, 2, 128), (6, 3, 32), (4, 1, 48), (10, 2, 80)],
)
def test_matches_the_oracle(dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> None:
    kernels = native_kernels()
    gen = torch.Generator().manual_seed(heads * dim)
    rows, span = 7, 67
    seq_lens = torch.tensor([1, 16, 17, 31, 48, 66, 67])
    keys = torch.randn(rows * kv_heads, span, dim, generator=gen).to(dtype)
    values = torch.randn(rows * kv_heads, span, dim, generator=gen).to(dtype)
    for row, length in enumerate(seq_lens.tolist()):
        keys.view(rows, kv_heads, span, dim)[row, :, length:] = float("nan")
        values.view(rows, kv_heads, span, dim)[row, :, length:] = float("nan")
    query = torch.randn(rows, heads, dim, generator=gen) * 3
    scale = dim**-0.5
    out = kernels.decode_attention(query, keys, values, seq_lens, scale)
    expected = _oracle(query, keys, values, seq_lens, scale)
    assert out.dtype == query.dtype and out.shape == query.shape
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_a_bfloat16_query_comes_back_in_bfloat16() -> None:
    kernels = native_kernels()
    keys = torch.randn(2, 5, 64).bfloat16()
    query = torch.randn(1, 6, 64).bfloat16()
    out = kernels.decode_attention(query, keys, keys.clone(), torch.tensor([5]), 0.125)
    expected = _oracle(query.float(), keys, keys.clone(), torch.tensor([5]), 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_supports_names_what_the_kernel_takes() -> None:
    kernels = native_kernels()
    keys = torch.zeros(1, 1, 64)
    assert kernels.supports(torch.zeros(1, 1, 64), keys)
    assert not kernels.supports(torch.zeros(1, 1, 40), torch.zeros(1, 1, 40))
    assert not kernels.supports(torch.zeros(1, 1, 64), keys.half())


def test_a_build_is_kept_under_its_hash_and_reused(tmp_path) -> None:
    native_kernels()  # skips where nothing can be built
    path = native.build(tmp_path)
    assert path.parent == tmp_path and path.name.startswith("decode_attention-")
    stamp = path.stat().st_mtime_ns
    assert native.build(tmp_path) == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary left behind"


def test_no_compiler_is_a_warning_and_none(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="kernels.native"):
        assert native.load(tmp_path / "kernels") is None
    assert "torch's products instead" in caplog.text
    assert not any((tmp_path / "kernels").glob("*.so"))


def test_a_failing_compile_names_the_compiler(tmp_path, monkeypatch) -> None:
    fake = tmp_path / "cxx"
    fake.write_text("#!/bin/sh\necho 'error: no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    try:
        native.build(tmp_path / "kernels")
    except native.NativeBuildError as exc:
        assert str(fake) in str(exc) and "no such thing" in str(exc)
    else:
        pytest.skip("this CPU has no AVX-512: the build stops before the compiler")
