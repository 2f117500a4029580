"""The paged decode attention's C++ kernel (``kernels/native/decode_attention.cpp``): built
once per machine with the machine's C++ compiler, loaded as the torch op
``servedeck::paged_decode_attention``.

Why a kernel of our own: at batch 64 on SmolLM2 the torch backend's decode attention
(``torch_attention._attend``: ``baddbmm``, softmax, ``bmm`` over gathered copies of the rows'
blocks) read K/V at about 12 GB/s, half this machine's memory rate: the products have three
query rows per KV head, far too few for the matrix library, and read each bucket's padded tail.
Keeping the gathered copies cost more again (``kernels.decode_gather``: the copies, buffers
regrown as rows join). The kernel reads the pool itself through the block tables, as vLLM's
CPU backend does, one pass per (row, KV head) over the row's own length (docs/benchmarks.md).

Two paths in the one source, chosen by what ``-march=native`` enables: AVX-512 (16 float
lanes; bfloat16 keys by VDPBF16PS where the CPU has AVX512_BF16) and AVX2 with FMA (8 lanes,
bfloat16 keys widened). Both score a bfloat16 key against the query rounded to bfloat16 and
compare to the same oracle; ``build(dir, ("-mno-avx512f",))`` builds the AVX2 path on an
AVX-512 CPU, which is how its tests check it there.

The build: ``g++ -O3 -march=native`` against torch's headers and libraries (no ninja, no
pybind11; about 7 s), into ``build_dir`` under a name hashed from the source, the flags, torch's
version, the compiler and the CPU's flags, written to a temporary name and renamed (two
processes building at once both succeed). ``load`` returns None, after one warning saying why,
where it cannot be built (no compiler, neither AVX-512 nor AVX2 with FMA, not torch's OpenMP
build): the torch
backend's batched products then run, as they do on CUDA.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from torch.utils.cpp_extension import include_paths

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "decode_attention.cpp"
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128)
"""Head dims the kernel is instantiated for (multiples of 16 AVX-512 lanes, so of 8 AVX2 ones)."""
KV_DTYPES = (torch.float32, torch.bfloat16)
BUILD_TIMEOUT_S = 180.0


class NativeBuildError(RuntimeError):
    """The kernel could not be built or loaded here (the message says why)."""


def default_build_dir() -> Path:
    """``$XDG_CACHE_HOME/servedeck/kernels`` (``~/.cache/servedeck/kernels``). Not under
    ``$SERVEDECK_HOME``: a build belongs to the machine and torch, not to one server's state,
    and every server a test suite starts in its own home shares it."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servedeck" / "kernels"


@dataclass(frozen=True, slots=True)
class NativeKernels:
    """The loaded kernel; ``library`` is the shared object it came from."""

    library: Path

    @staticmethod
    def supports(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
        """The pool's shapes the kernel is built for."""
        return device.type == "cpu" and head_dim in HEAD_DIMS and dtype in KV_DTYPES

    @staticmethod
    def paged_decode_attention(
        query: torch.Tensor,
        k_storage: torch.Tensor,
        v_storage: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """``query`` ``[B, heads, dim]`` over one layer's head-major pool (``k_storage``,
        ``v_storage`` ``[kv_heads, num_blocks, block_size, dim]``) through ``block_tables``
        ``[B, width]`` int64 up to ``seq_lens`` ``[B]`` int64 -> ``[B, heads, dim]`` in the
        query's dtype (scores, softmax and sums in float32)."""
        out: torch.Tensor = torch.ops.servedeck.paged_decode_attention(
            query.float().contiguous(), k_storage, v_storage, block_tables, seq_lens, scale
        )
        return out.to(query.dtype)


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise NativeBuildError("no C++ compiler (g++ or $CXX)")
    return compiler


def _command(compiler: str, out: Path, extra_flags: tuple[str, ...] = ()) -> list[str]:
    torch_lib = Path(torch.__file__).parent / "lib"
    openmp = torch.backends.openmp.is_available()  # type: ignore[no-untyped-call]  # unannotated
    parallel = ["-fopenmp", "-DAT_PARALLEL_OPENMP=1"] if openmp else ["-DAT_PARALLEL_NATIVE=1"]
    return [
        compiler,
        "-O3",
        "-march=native",
        *extra_flags,
        *parallel,
        "-fPIC",
        "-shared",
        "-std=c++20",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
        *(f"-I{path}" for path in include_paths()),
        str(SOURCE),
        f"-L{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
        f"-Wl,-rpath,{torch_lib}",
        "-o",
        str(out),
    ]


def cpu_flags() -> str:
    """The ``flags`` line of ``/proc/cpuinfo`` (the processor's name where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith("flags")), "")


def missing_isa(flags: str) -> str | None:
    """Why a CPU with these ``/proc/cpuinfo`` flags cannot run the kernel, or None where it can
    (AVX-512 Foundation, or AVX2 with FMA)."""
    names = set(flags.split())
    if "avx512f" in names or {"avx2", "fma"} <= names:
        return None
    return "this CPU has neither AVX-512 nor AVX2 with FMA"


def isa(extra_flags: tuple[str, ...] = ()) -> str:
    """The path a build with these flags runs on this CPU: ``"avx512"`` or ``"avx2"``."""
    names = set(cpu_flags().split())
    if "avx512f" in names and "-mno-avx512f" not in extra_flags:
        return "avx512"
    return "avx2"


def library_path(build_dir: Path, compiler: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """Where this source, these flags, this torch and this CPU's build lives."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(" ".join(_command(compiler, Path("out"), extra_flags)).encode())
    key.update(torch.__version__.encode())
    key.update(cpu_flags().encode())
    return build_dir / f"decode_attention-{key.hexdigest()[:16]}.so"


def build(build_dir: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """The kernel's shared object for this machine, compiled unless already there.
    ``extra_flags`` go after ``-march=native`` (``-mno-avx512bf16`` builds the path a CPU
    without AVX512_BF16 runs, ``-mno-avx512f`` the AVX2 one)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise NativeBuildError(
            f"the kernel is x86-64 (AVX-512 or AVX2 with FMA), this is {platform.machine()}"
        )
    missing = missing_isa(cpu_flags())
    if missing is not None:
        raise NativeBuildError(missing)
    compiler = _compiler()
    path = library_path(build_dir, compiler, extra_flags)
    if path.is_file():
        return path
    build_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp.so")
    try:
        done = subprocess.run(
            _command(compiler, partial, extra_flags),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"the compiler did not run: {exc}") from exc
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise NativeBuildError(f"{compiler} failed: {' / '.join(tail)}")
    os.replace(partial, path)
    return path


@cache
def _load_library(path: Path) -> None:
    """Load once per process: torch registers an op namespace once."""
    if not hasattr(torch.ops.servedeck, "paged_decode_attention"):
        torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]  # unannotated in torch


def load(build_dir: Path | None = None) -> NativeKernels | None:
    """The kernel, built into ``build_dir`` (``default_build_dir()``) if need be; None, after a
    warning that says why, where it cannot be built or loaded here."""
    try:
        path = build(build_dir or default_build_dir())
        _load_library(path)
    except (NativeBuildError, OSError, RuntimeError) as exc:
        log.warning("native decode attention unavailable, torch's products instead: %s", exc)
        return None
    log.info("native decode attention (%s): %s", isa(), path)
    return NativeKernels(path)
