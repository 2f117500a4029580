"""``--dtype auto``: bfloat16 where the CPU multiplies bfloat16 itself, float32 elsewhere; an
explicit bfloat16 without that arithmetic runs and says at start-up that it will be slow.

Both kinds of CPU are judged here on any machine: as described features, and in a process
whose torch is held to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, as an AVX2-only EPYC runs)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from engine.config import EngineConfig
from engine.cpu import CpuFeatures, choose_dtype, cpu_features, warn_if_slow

SAPPHIRE = CpuFeatures(
    "Intel Xeon (AVX-512 BF16)",
    "AVX512",
    frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16"}),
)
EPYC_AVX2 = CpuFeatures("AMD EPYC (AVX2 only)", "AVX2", frozenset({"avx2", "fma", "f16c"}))
SKYLAKE = CpuFeatures("Intel Xeon (AVX-512, no BF16)", "AVX512", frozenset({"avx2", "avx512f"}))


def test_auto_is_bfloat16_only_where_the_cpu_has_bfloat16_arithmetic() -> None:
    assert choose_dtype("auto", cpu=SAPPHIRE).dtype == "bfloat16"
    assert choose_dtype("auto", cpu=EPYC_AVX2).dtype == "float32"
    assert choose_dtype("auto", cpu=SKYLAKE).dtype == "float32"
    assert choose_dtype("auto", "cuda").dtype == "bfloat16"
    assert "has no bfloat16 arithmetic" in choose_dtype("auto", cpu=EPYC_AVX2).reason


def test_a_cpu_held_below_its_bfloat16_isa_counts_as_without_it(monkeypatch) -> None:
    held = CpuFeatures(SAPPHIRE.model, "AVX2", SAPPHIRE.flags)  # ATEN_CPU_CAPABILITY=avx2
    assert choose_dtype("auto", cpu=held).dtype == "float32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert choose_dtype("auto", cpu=SAPPHIRE).dtype == "float32"


def test_an_explicit_dtype_is_kept_and_a_slow_one_is_said(caplog) -> None:
    slow = choose_dtype("bfloat16", cpu=EPYC_AVX2)
    assert slow.dtype == "bfloat16" and slow.slow
    fast = choose_dtype("bfloat16", cpu=SAPPHIRE)
    assert fast.dtype == "bfloat16" and not fast.slow
    assert not choose_dtype("float32", cpu=EPYC_AVX2).slow
    with caplog.at_level(logging.INFO, logger="engine.cpu"):
        warn_if_slow(slow)
        warn_if_slow(fast)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "slower than float32" in warnings[0].getMessage()


def test_config_keeps_auto_and_resolves_it_for_this_cpu() -> None:
    config = EngineConfig(model="m", dtype="auto")
    assert config.dtype == "auto"
    want = "bfloat16" if cpu_features().bf16_arithmetic else "float32"
    assert config.weights_dtype == want
    assert EngineConfig(model="m").weights_dtype == "float32"  # the tests' and presets' default
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(model="m", dtype="int8")  # type: ignore[arg-type]  # refused at the edge


@pytest.mark.parametrize("held", [None, "avx2", "default"])
def test_the_level_is_torchs_own_and_auto_on_a_torch_held_to_avx2_is_float32(held) -> None:
    code = (
        "import torch; from engine.config import EngineConfig; "
        "from engine.cpu import cpu_features; "
        "print(EngineConfig(model='m', dtype='auto').weights_dtype, "
        "cpu_features().capability, torch.backends.cpu.get_cpu_capability())"
    )
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if held is not None:
        env["ATEN_CPU_CAPABILITY"] = held
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    dtype, ours, torchs = done.stdout.split()
    assert ours == torchs
    if held is not None:
        assert dtype == "float32"
