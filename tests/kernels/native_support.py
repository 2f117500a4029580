"""The native decode attention for tests: built once into the run's cache (a fresh HOME under
.ci/run), skipped where this machine cannot build it (neither AVX-512 nor AVX2 with FMA, no
g++), and a failure instead under ``CI=true`` on a machine that can."""

from __future__ import annotations

import os
import shutil
from functools import cache

import pytest

from kernels import native
from kernels.native import NativeKernels


def buildable_here() -> bool:
    return native.missing_isa(native.cpu_flags()) is None and shutil.which("g++") is not None


def has_avx512() -> bool:
    """The CPU runs the AVX-512 path (else the AVX2 one is its default build)."""
    return "avx512f" in native.cpu_flags().split()


@cache
def _load() -> NativeKernels | None:
    return native.load()


def native_kernels() -> NativeKernels:
    kernels = _load()
    if kernels is None:
        if os.environ.get("CI") == "true" and buildable_here():
            pytest.fail("the native decode attention must build here (AVX-512 or AVX2+FMA, g++)")
        pytest.skip("the native decode attention cannot be built here")
    return kernels
