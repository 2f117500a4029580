"""Rotary position embedding with ``rope_theta`` and the llama3 frequency scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        linear: float = scaling["factor"]
        return inv_freq / linear
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3)")
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, and the band
    # between the two cut-offs interpolated smoothly.
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


@dataclass(frozen=True, slots=True)
class RopeTables:
    """cos and sin at one step's positions, ``[T, 1, dim / 2]`` float32: gathered once per
    step (``RotaryEmbedding.tables``) and shared by every layer."""

    cos: torch.Tensor
    sin: torch.Tensor


class RotaryEmbedding:
    """Precomputed cos/sin tables indexed by absolute position (the half-split layout)."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None,
        device: torch.device,
    ) -> None:
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        self.cos = freqs.cos().to(device)
        self.sin = freqs.sin().to(device)

    def tables(self, positions: torch.Tensor) -> RopeTables:
        return RopeTables(self.cos[positions][:, None, :], self.sin[positions][:, None, :])

    def __call__(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query`` ``[T, heads, dim]``, ``key`` ``[T, kv_heads, dim]``; rotated copies."""
        tables = self.tables(positions)
        query, key = query.clone(), key.clone()
        rotate_(query, tables)
        rotate_(key, tables)
        return query, key


def rotate_(x: torch.Tensor, tables: RopeTables) -> None:
    """Rotates ``x`` ``[T, heads, dim]`` (a view is fine: q and k side by side in the fused
    qkv product) in place: computed in float32, written back in ``x``'s dtype. Half-width
    views, no ``cat``, one call for q and k together."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    first = x1 * tables.cos
    first.sub_(x2 * tables.sin)  # not addcmul_: its fused rounding parts from transformers'
    second = x2 * tables.cos
    second.add_(x1 * tables.sin)
    x1.copy_(first)
    x2.copy_(second)
