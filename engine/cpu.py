"""What this CPU can compute fast, and the dtype that fits it (``--dtype auto``).

bfloat16 pays on a CPU only where the CPU multiplies bfloat16 itself: AVX-512 BF16 or AMX
(about twice float32's matrix rate, half the bytes of weights and KV). Elsewhere torch widens
every bfloat16 product in software: on an AVX2-only AMD EPYC its bfloat16 products ran at
6–12 GFLOP/s against float32's 25–70 (SmolLM2's shapes, 2 threads), and oneDNN refuses to pack
bfloat16 weights there. So ``auto`` is bfloat16 where the CPU has bfloat16 arithmetic and
float32 otherwise; an explicit ``bfloat16`` without it runs, with one warning at start-up.

torch's own dispatch decides which kernels run, so the answer follows it:
``ATEN_CPU_CAPABILITY=avx2`` (torch) or ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN) make an AVX-512
machine answer as an AVX2 one does, which is how tests reproduce the AVX2 choice. The level is
read as torch reads it (the CPU's flags, lowered by ``ATEN_CPU_CAPABILITY``) without importing
torch: ``EngineConfig`` and the engine's front import none (tests/engine/test_front.py).
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of bfloat16 arithmetic (VDPBF16PS; AMX tiles)."""
_NARROWING_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")
"""``ONEDNN_MAX_CPU_ISA`` values that leave oneDNN without bfloat16 instructions."""


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """The CPU as the engine's kernels see it."""

    model: str
    """The model name (``/proc/cpuinfo``), for the log and every speed figure."""
    capability: str
    """torch's dispatch level (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512…)."""
    flags: frozenset[str]

    @property
    def bf16_arithmetic(self) -> bool:
        """bfloat16 products in hardware, and torch and oneDNN allowed to use them."""
        if not any(flag in self.flags for flag in BF16_FLAGS):
            return False
        if not self.capability.startswith("AVX512"):
            return False  # torch dispatches at AVX2 (or lower): its bfloat16 widens in software
        return os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() not in _NARROWING_ISAS

    @property
    def summary(self) -> str:
        """One line: model, torch's level, and which of the flags that matter are present."""
        shown = [f for f in ("avx2", "fma", "avx512f", *BF16_FLAGS) if f in self.flags]
        return f"{self.model} ({self.capability}; {' '.join(shown) or 'no vector flags'})"


@cache
def cpu_features() -> CpuFeatures:
    """This machine's CPU (read once per process)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = fields.get("flags", "")
    present = frozenset(flags.split())
    return CpuFeatures(model=model, capability=torch_capability(present), flags=present)


_LEVELS = ("DEFAULT", "AVX2", "AVX512")
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


def torch_capability(flags: frozenset[str]) -> str:
    """The level torch's CPU dispatch runs at (``torch.backends.cpu.get_cpu_capability()``)
    for a CPU with ``flags``: the highest the CPU supports, lowered (never raised) by
    ``ATEN_CPU_CAPABILITY``."""
    level = "AVX512" if flags >= _AVX512 else "AVX2" if flags >= {"avx2", "fma"} else "DEFAULT"
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    if asked in _LEVELS and _LEVELS.index(asked) < _LEVELS.index(level):
        return asked
    return level


DtypeName = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The dtype in force and why (``/admin/state``, the start-up log)."""

    dtype: DtypeName
    reason: str
    slow: bool = False
    """bfloat16 asked for on a CPU that widens it in software (several times float32's time)."""


def choose_dtype(
    requested: str, device: str = "cpu", cpu: CpuFeatures | None = None
) -> DtypeChoice:
    """``requested`` (``auto`` or a dtype's name) on ``device``, judged against ``cpu``
    (this machine's by default). ValueError names a dtype that is none of ours."""
    if device != "cpu":
        if requested == "auto":
            return DtypeChoice("bfloat16", f"auto on {device}: bfloat16")
        return DtypeChoice(_dtype_name(requested), f"asked for, on {device}")
    cpu = cpu or cpu_features()
    has = "has" if cpu.bf16_arithmetic else "has no"
    why = f"the CPU {has} bfloat16 arithmetic: {cpu.summary}"
    if requested == "auto":
        return DtypeChoice("bfloat16" if cpu.bf16_arithmetic else "float32", f"auto, {why}")
    name = _dtype_name(requested)
    slow = name != "float32" and not cpu.bf16_arithmetic
    return DtypeChoice(name, f"asked for; {why}", slow=slow)


def _dtype_name(name: str) -> DtypeName:
    for dtype in ("float32", "bfloat16", "float16"):
        if dtype == name:
            return dtype
    raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {name!r}")


def warn_if_slow(choice: DtypeChoice) -> None:
    """One warning at start-up where the dtype asked for will run several times slower than
    float32 here (never silently); the dtype in force, and why, at info otherwise."""
    if choice.slow:
        log.warning(
            "--dtype %s on a CPU without bfloat16 arithmetic: torch widens every product in "
            "software, several times slower than float32 (%s); --dtype auto picks float32 here",
            choice.dtype,
            choice.reason,
        )
    else:
        log.info("dtype %s: %s", choice.dtype, choice.reason)


@dataclass(frozen=True, slots=True)
class ComputeChoice:
    """What the engine computes with, chosen once at start-up, and why (``/admin/state``)."""

    cpu: str
    """``CpuFeatures.summary`` (the device's name on a GPU)."""
    dtype: DtypeName
    dtype_reason: str
    attention: str
    """The decode attention in force: ``native`` (servedeck's kernel), ``torch`` (torch's
    batched products) or ``triton``."""
    attention_reason: str
