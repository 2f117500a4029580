"""Which checkpoint format a path names, without importing any reader (no torch, no gguf): the
chat template's render workers ask this of every path, and must start in a fraction of a
second."""

from __future__ import annotations

from pathlib import Path

GGUF_SUFFIX = ".gguf"


def is_gguf(path: str | Path) -> bool:
    """A llama.cpp GGUF file (one file, or any part of a split one)."""
    return str(path).endswith(GGUF_SUFFIX)
