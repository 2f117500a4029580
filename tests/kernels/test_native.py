"""The native paged decode attention (kernels/native) against the plain oracle, and its build.

The kernel reads the pool through each row's block table up to the row's length, so every
position no row owns is NaN here: a read past a row's end or of a wrong block would show.
Shapes cover GQA groups past one pass of four heads, head dims 16 to 128, lengths of 1, of a
16-lane (and an 8-lane) tail and of whole blocks. The default build is the path this CPU runs
(AVX-512 or AVX2); on an AVX-512 CPU the AVX2 path and the one without AVX512_BF16 are built
with ``-mno-avx512f`` / ``-mno-avx512bf16`` and checked against the same oracle, each in a
process of its own (an op namespace loads once per process).
"""

from __future__ import annotations

import logging
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import native, reference
from tests.kernels.native_support import has_avx512, native_kernels

BLOCK = 16


def _pool(gen, kv_heads, num_blocks, dim, dtype, block=BLOCK):
    """A head-major pool ``[kv_heads, num_blocks, block, dim]`` of NaN: what a row does not
    own must never be read."""
    return torch.full((kv_heads, num_blocks, block, dim), float("nan")).to(dtype)


BLOCKS = [1, 8, 12, 32]
"""Block sizes besides BLOCK: shorter than a vector's positions, not a multiple, longer."""
SHAPES = [(4, 4, 16), (9, 3, 64), (14, 2, 64), (8, 2, 128), (6, 3, 32), (4, 1, 48), (10, 2, 80)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
def test_matches_the_oracle(dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> None:
    check_against_the_oracle(native_kernels(), dtype, heads, kv_heads, dim)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_other_block_sizes_match_the_oracle(dtype: torch.dtype, block: int) -> None:
    check_against_the_oracle(native_kernels(), dtype, 9, 3, 64, block)


def check_against_the_oracle(
    kernels: native.NativeKernels,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    dim: int,
    block: int = BLOCK,
) -> None:
    """Rows of 1, 16, 17, 31, 48, 66 and 67 tokens on shuffled blocks; padded tables."""
    gen = torch.Generator().manual_seed(heads * dim)
    lens = [1, 16, 17, 31, 48, 66, 67]
    widths = [-(-n // block) for n in lens]
    num_blocks = sum(widths) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    k_pool = _pool(gen, kv_heads, num_blocks, dim, dtype, block)
    v_pool = _pool(gen, kv_heads, num_blocks, dim, dtype, block)
    tables = torch.zeros(len(lens), max(widths), dtype=torch.int64)
    for row, n in enumerate(lens):
        blocks = [order.pop() for _ in range(widths[row])]
        tables[row, : len(blocks)] = torch.tensor(blocks)
        for position in range(n):
            index, offset = blocks[position // block], position % block
            for pool in (k_pool, v_pool):
                pool[:, index, offset] = torch.randn(kv_heads, dim, generator=gen).to(dtype)
    seq_lens = torch.tensor(lens)
    query = torch.randn(len(lens), heads, dim, generator=gen) * 3
    scale = dim**-0.5
    out = kernels.paged_decode_attention(query, k_pool, v_pool, tables, seq_lens, scale)
    k_cache, v_cache = k_pool.permute(1, 2, 0, 3), v_pool.permute(1, 2, 0, 3)
    # against bfloat16 keys the kernel scores the query rounded to bfloat16, the keys' dtype
    scored = query.to(dtype).float()
    expected = reference.decode_attention(scored, k_cache, v_cache, tables, seq_lens, scale)
    assert out.dtype == query.dtype and out.shape == query.shape
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


_OTHER_PATH = """
import sys
from pathlib import Path
import torch
from kernels import native
from tests.kernels.test_native import BLOCKS, SHAPES, check_against_the_oracle

flags = tuple(sys.argv[2:])
path = native.build(Path(sys.argv[1]), flags)
torch.ops.load_library(str(path))
dtypes = [torch.bfloat16] if flags == ("-mno-avx512bf16",) else [torch.float32, torch.bfloat16]
checked = 0
for dtype in dtypes:
    for shape in SHAPES:
        check_against_the_oracle(native.NativeKernels(path), dtype, *shape)
        checked += 1
    for block in BLOCKS:
        check_against_the_oracle(native.NativeKernels(path), dtype, 9, 3, 64, block)
        checked += 1
print("checked", checked, native.isa(flags))
"""


def _check_built_with(flags: tuple[str, ...], build_dir: Path) -> str:
    """Build with ``flags`` in a process of its own and check it against the oracle there;
    its last line of output."""
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PATH, str(build_dir), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_path_without_avx512_bf16_scores_as_the_bf16_products_do(tmp_path) -> None:
    """Built with ``-mno-avx512bf16`` (a CPU without VDPBF16PS widens bfloat16 keys to
    float32), against the same oracle."""
    native_kernels()  # skips where nothing can be built
    if not has_avx512():
        pytest.skip("this CPU has no AVX-512: there is no VDPBF16PS path to leave out")
    checked = _check_built_with(("-mno-avx512bf16",), tmp_path)
    assert checked == f"checked {len(SHAPES) + len(BLOCKS)} avx512"


def test_the_avx2_path_matches_the_oracle(tmp_path) -> None:
    """Built with ``-mno-avx512f`` on an AVX-512 CPU: the 8-lane path an AVX2 CPU runs, both
    dtypes against the same oracle."""
    native_kernels()  # skips where nothing can be built
    if not has_avx512():
        pytest.skip("this CPU has no AVX-512: its default build is the AVX2 path, checked above")
    checked = _check_built_with(("-mno-avx512f",), tmp_path)
    assert checked == f"checked {2 * (len(SHAPES) + len(BLOCKS))} avx2"


def test_a_bfloat16_query_comes_back_in_bfloat16() -> None:
    kernels = native_kernels()
    pool = torch.randn(2, 1, BLOCK, 64).bfloat16()
    query = torch.randn(1, 6, 64).bfloat16()
    tables, lens = torch.zeros(1, 1, dtype=torch.int64), torch.tensor([5])
    out = kernels.paged_decode_attention(query, pool, pool, tables, lens, 0.125)
    cache = pool.permute(1, 2, 0, 3)
    expected = reference.decode_attention(query.float(), cache, cache, tables, lens, 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_a_block_outside_the_pool_is_refused_not_read() -> None:
    kernels = native_kernels()
    pool = torch.zeros(1, 4, BLOCK, 64)
    query = torch.zeros(1, 1, 64)
    with pytest.raises(RuntimeError, match="names block 4"):
        kernels.paged_decode_attention(
            query, pool, pool, torch.tensor([[0, 4]]), torch.tensor([BLOCK + 1]), 1.0
        )
    with pytest.raises(RuntimeError, match="longer than its table"):
        kernels.paged_decode_attention(
            query, pool, pool, torch.tensor([[0]]), torch.tensor([BLOCK + 1]), 1.0
        )


def test_supports_names_what_the_kernel_takes() -> None:
    kernels = native_kernels()
    cpu = torch.device("cpu")
    assert kernels.supports(64, torch.float32, cpu) and kernels.supports(128, torch.bfloat16, cpu)
    assert not kernels.supports(40, torch.float32, cpu)
    assert not kernels.supports(64, torch.float16, cpu)
    assert not kernels.supports(64, torch.float32, torch.device("cuda"))


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
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the build stops before the compiler on {platform.machine()}")
    missing = native.missing_isa(native.cpu_flags())
    if missing is not None:
        pytest.skip(f"{missing}: the build stops before the compiler")
    fake = tmp_path / "cxx"
    fake.write_text("#!/bin/sh\necho 'error: no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(native.NativeBuildError) as raised:
        native.build(tmp_path / "kernels")
    assert str(fake) in str(raised.value) and "no such thing" in str(raised.value)
    assert not any((tmp_path / "kernels").glob("*.so")), "no partial build left behind"


@pytest.mark.parametrize(
    ("flags", "missing"),
    [
        ("fpu sse2 avx avx2 fma f16c avx512f avx512bw", False),
        ("fpu sse2 avx avx2 fma f16c", False),
        ("fpu sse2 avx fma4 avx2", True),  # FMA4 is not FMA
        ("fpu sse2 avx f16c fma", True),
        ("", True),
    ],
)
def test_the_build_needs_avx512_or_avx2_with_fma(flags: str, missing: bool) -> None:
    reason = native.missing_isa(flags)
    assert (reason is not None) == missing
    if missing:
        assert reason == "this CPU has neither AVX-512 nor AVX2 with FMA"


def test_the_path_a_build_runs_is_named() -> None:
    assert native.isa(("-mno-avx512f",)) == "avx2"
    assert native.isa() == ("avx512" if has_avx512() else "avx2")
