"""The torch backend's tiled causal attention (a prefill chunk that is its whole sequence,
longer than one tile) against a dense attention computed from scratch."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels.torch_attention import CAUSAL_TILE, causal_self_attention, prefill_attention


def _dense(q, k, v, scale):
    """Causal attention of ``q`` ``[L, heads, dim]`` over ``k``/``v`` ``[L, kv_heads, dim]``,
    GQA by repeating kv heads, in float64."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    n = q.shape[0]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


def _qkv(length, heads, kv_heads, dim):
    """q/k/v as views of one fused product row, as the model hands them over."""
    fused = torch.randn(length, (heads + 2 * kv_heads) * dim)
    q, k, v = fused.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return (
        q.view(length, heads, dim),
        k.view(length, kv_heads, dim),
        v.view(length, kv_heads, dim),
    )


@pytest.mark.parametrize("length", [1, CAUSAL_TILE - 1, CAUSAL_TILE + 1, 2 * CAUSAL_TILE, 300])
@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 4), (4, 4), (6, 1)])
def test_tiled_causal_attention_matches_dense(length, heads, kv_heads) -> None:
    torch.manual_seed(length)
    q, k, v = _qkv(length, heads, kv_heads, 16)
    out = torch.empty(length, heads, 16)
    causal_self_attention(q, k, v, 0.25, out)
    torch.testing.assert_close(out, _dense(q, k, v, 0.25), atol=2e-5, rtol=1e-4)


def test_packed_prefill_with_long_rows_matches_dense_per_row() -> None:
    """Rows longer than a tile (the tiled path) packed beside short ones (SDPA)."""
    torch.manual_seed(0)
    lengths = [300, 40, CAUSAL_TILE + 7, 1]
    q, k, v = _qkv(sum(lengths), 8, 4, 16)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    storages = (torch.zeros(4, 1, 16, 16), torch.zeros(4, 1, 16, 16))  # never read: no prefix
    tables = torch.zeros(len(lengths), 1, dtype=torch.int32)
    out = prefill_attention(q, k, v, storages, tables, lengths, starts, 0.25)
    for a, b in itertools.pairwise(starts):
        want = _dense(q[a:b], k[a:b], v[a:b], 0.25)
        torch.testing.assert_close(out[a:b], want, atol=2e-5, rtol=1e-4)
