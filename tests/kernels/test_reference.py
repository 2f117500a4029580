"""The plain oracle gives the same answers whichever way the pool is stored, and agrees with a
dense attention computed from scratch (tests/kernels/test_backends.py holds every backend to
it)."""

from __future__ import annotations

import pytest
import torch

from engine.kv_pool import allocate_kv_cache
from kernels import reference
from kernels.torch_attention import head_major as head_major_storage


def _pools(num_blocks=20, block_size=16, kv_heads=2, dim=32):
    head_major = allocate_kv_cache(1, num_blocks, block_size, kv_heads, dim, torch.float32, "cpu")
    token_major = torch.zeros(2, num_blocks, block_size, kv_heads, dim)
    return head_major[0], token_major


def _dense(q, k, v, scale, q_positions):
    """Attention of each query over keys ``0..pos``, GQA by repeating kv heads."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    keys = torch.arange(k.shape[0])
    scores = scores.masked_fill(keys[None, None, :] > q_positions[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_head_major_pool_is_detected_and_token_major_is_not():
    head_major, token_major = _pools()
    assert head_major_storage(head_major[0]) is not None
    assert head_major_storage(token_major[0]) is None
    assert head_major.shape == token_major.shape


@pytest.mark.parametrize("seq_lens", [[1, 16, 17, 40], [33, 5, 64, 2]])
def test_decode_and_prefill_agree_across_layouts_and_with_dense_attention(seq_lens):
    torch.manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 32, 16
    pools = _pools(block_size=block, kv_heads=kv_heads, dim=dim)
    tables = torch.tensor([[4 * i + 3, 4 * i + 1, 4 * i, 19 - i] for i in range(4)])
    keys = [torch.randn(n, kv_heads, dim) for n in seq_lens]
    values = [torch.randn(n, kv_heads, dim) for n in seq_lens]
    for pool in pools:
        for table, k, v in zip(tables, keys, values, strict=True):
            pos = torch.arange(k.shape[0])
            slots = table[pos // block] * block + pos % block
            reference.write_kv_cache(k, v, pool[0], pool[1], slots)
    q = torch.randn(4, heads, dim)
    lens = torch.tensor(seq_lens)
    decoded = [reference.decode_attention(q, pool[0], pool[1], tables, lens, 0.2) for pool in pools]
    torch.testing.assert_close(decoded[0], decoded[1])
    for i, n in enumerate(seq_lens):
        want = _dense(q[i : i + 1], keys[i], values[i], 0.2, torch.tensor([n - 1]))
        torch.testing.assert_close(decoded[0][i : i + 1], want)

    chunk = [min(n, 5) for n in seq_lens]  # the last tokens of each sequence, as an extend
    starts = [0]
    for c in chunk:
        starts.append(starts[-1] + c)
    query = torch.randn(starts[-1], heads, dim)
    extended = [
        reference.prefill_attention(query, pool[0], pool[1], tables, seq_lens, starts, 0.2)
        for pool in pools
    ]
    torch.testing.assert_close(extended[0], extended[1])
    for i, (n, c) in enumerate(zip(seq_lens, chunk, strict=True)):
        positions = torch.arange(n - c, n)
        want = _dense(query[starts[i] : starts[i + 1]], keys[i], values[i], 0.2, positions)
        torch.testing.assert_close(extended[0][starts[i] : starts[i + 1]], want)


def test_padding_slots_are_not_written():
    pool, _ = _pools()
    key = torch.ones(3, 2, 32)
    reference.write_kv_cache(key, key, pool[0], pool[1], torch.tensor([0, -1, 5]))
    assert int((pool[0] != 0).any(-1).sum()) == 2 * 2  # two slots, two heads each
