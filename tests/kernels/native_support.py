"""The native decode attention for tests: built once into the run's cache (a fresh HOME under
.ci/run), skipped where this machine cannot build it (no AVX-512, no g++), and a failure
instead under ``CI=true`` on a machine that can."""

from __future__ import annotations

import os
import shutil
from functools import cache
from pathlib import Path

import pytest

from kernels import native
from kernels.native import NativeKernels


def buildable_here() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return "avx512f" in flags and shutil.which("g++") is not None


@cache
def _load() -> NativeKernels | None:
    return native.load()


def native_kernels() -> NativeKernels:
    kernels = _load()
    if kernels is None:
        if os.environ.get("CI") == "true" and buildable_here():
            pytest.fail("the native decode attention must build here (AVX-512 and g++)")
        pytest.skip("the native decode attention cannot be built here")
    return kernels
