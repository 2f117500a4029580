"""Build an attention backend by name: the one place that knows every backend (as
``policies/registry.py`` is for policies).

The runner asks ``make_backend`` for the backend ``resolve_backend`` chose from the config's
``attention_backend`` and the device. Importing this imports no triton: the Triton backend
loads its kernels when it is built.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Literal

import torch

from kernels.attention import AttentionBackend
from kernels.native import NativeKernels
from kernels.torch_backend import TorchAttentionBackend
from kernels.triton_backend import TritonAttentionBackend

Backend = Literal["torch", "triton"]
BackendChoice = Literal["auto", "torch", "triton"]
BACKENDS: dict[str, type[AttentionBackend[Any]]] = {
    cls.name: cls for cls in (TorchAttentionBackend, TritonAttentionBackend)
}


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(choice: BackendChoice, device: torch.device) -> Backend:
    """``auto`` picks Triton on CUDA and the torch backend everywhere else."""
    if choice == "torch":
        return "torch"
    if choice == "triton":
        if not triton_available():
            raise ValueError("attention_backend='triton' needs the triton package")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "attention_backend='triton' off CUDA needs TRITON_INTERPRET=1 set before "
                "triton is imported (the interpreter; slow, for tests)"
            )
        return "triton"
    if choice != "auto":
        raise ValueError(f"attention_backend must be auto, torch or triton, not {choice!r}")
    return "triton" if device.type == "cuda" and triton_available() else "torch"


def make_backend(
    name: Backend,
    kv_caches: list[torch.Tensor],
    block_size: int,
    native: NativeKernels | None = None,
) -> AttentionBackend[Any]:
    """The backend ``name`` (as ``resolve_backend`` chose it) over this pool; the torch
    backend's decode attention runs ``native`` where given (``kernels.native.load``). Its
    metadata type is the backend's own (``Any`` here): the runner hands ``prepare``'s result
    back to ``forward`` untouched."""
    cls = BACKENDS.get(name)
    if cls is None:
        raise ValueError(f"unknown attention backend {name!r} (known: {', '.join(BACKENDS)})")
    if cls is TorchAttentionBackend:
        return TorchAttentionBackend(kv_caches, block_size, native=native)
    return cls(kv_caches, block_size)
