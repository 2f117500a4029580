"""Triton kernels under TRITON_INTERPRET=1 against the torch reference, on tiny shapes.

The default run covers every pair of factor values (dtype, GQA ratio, block size, head dim,
context shape, block-table layout); ``pytest -m triton_full`` runs the whole cartesian grid.
"""

from __future__ import annotations

import math
import zlib
from itertools import combinations, product
from typing import NamedTuple

import pytest
import torch

from engine.kv_pool import allocate_kv_cache
from kernels import reference
from kernels.attention import AttentionInputs, AttentionMetadata, build_metadata
from kernels.registry import make_backend, resolve_backend
from kernels.triton import ops

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The kernels compute in float32 and round once; compared with the reference run in float32
# on the same (rounded) inputs, the error is the output dtype's rounding.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
NUM_KV_HEADS = 2

FACTORS: dict[str, tuple] = {
    "dtype": tuple(DTYPES),
    "group": (1, 2, 4),
    "block_size": (16, 32, 64),
    "head_dim": (64, 128),
    "context": ("one", "edge-1", "edge", "edge+1", "many"),
    "table": ("scattered", "shared"),
}


class Case(NamedTuple):
    dtype: str
    group: int
    block_size: int
    head_dim: int
    context: str
    table: str


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """One layer's write and attention (``kv_cache`` ``[2, num_blocks, block_size, kv_heads,
    dim]``) through the plain oracle: what a backend's ``forward`` must equal (once product
    code as ``kernels.attention.paged_attention``; only this test still uses it)."""
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    reference.write_kv_cache(key, value, k_cache, v_cache, meta.slot_mapping)
    n = meta.num_decode_tokens
    out = torch.empty_like(query)
    if n:
        out[:n] = reference.decode_attention(
            query[:n], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale
        )
    if n < query.shape[0]:
        out[n:] = reference.prefill_attention(
            query[n:],
            k_cache,
            v_cache,
            meta.prefill_block_tables,
            meta.prefill_seq_lens,
            meta.prefill_query_start_loc,
            scale,
        )
    return out


def pairwise(factors: dict[str, tuple]) -> list[tuple]:
    """Greedy all-pairs cover: each row is the candidate covering most uncovered pairs."""
    values = list(factors.values())
    index_pairs = list(combinations(range(len(values)), 2))
    uncovered = {(i, a, j, b) for i, j in index_pairs for a in values[i] for b in values[j]}
    candidates = list(product(*values))
    rows = []
    while uncovered:
        best = max(
            candidates,
            key=lambda row: sum((i, row[i], j, row[j]) in uncovered for i, j in index_pairs),
        )
        rows.append(best)
        uncovered -= {(i, best[i], j, best[j]) for i, j in index_pairs}
    return rows


def case_id(case: Case) -> str:
    dtype, group, block_size, head_dim, context, table = case
    return f"{dtype}-g{group}-bs{block_size}-d{head_dim}-{context}-{table}"


PAIRWISE = [Case(*row) for row in pairwise(FACTORS)]
FULL = [Case(*row) for row in product(*FACTORS.values())]


def context_lens(context: str, block_size: int) -> list[int]:
    """Three sequences per batch: the named shape first, then companions of other lengths."""
    return {
        "one": [1, 2, 1],
        "edge-1": [block_size - 1, 2 * block_size - 1, 3],
        "edge": [block_size, 2 * block_size, 1],
        "edge+1": [block_size + 1, 2 * block_size + 1, block_size],
        "many": [6 * block_size + 5, 4 * block_size, 2],
    }[context]


class Paged(NamedTuple):
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor


def make_paged(case: Case, lens: list[int], gen: torch.Generator) -> Paged:
    """Random cache and block tables: blocks scattered over the pool in random order, or (for
    ``shared``) every sequence reading sequence 0's physical blocks for its leading blocks.
    Unused table entries hold valid but unrelated block ids, so a missing mask shows."""
    bs = case.block_size
    needed = [-(-n // bs) for n in lens]
    max_blocks = max(needed) + 1
    num_blocks = sum(needed) + 3
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (len(lens), max_blocks), generator=gen)
    used = 0
    for i, n in enumerate(needed):
        tables[i, :n] = order[used : used + n]
        used += n
        if case.table == "shared" and i > 0:
            common = min(n, needed[0])
            tables[i, :common] = tables[0, :common]
    dtype = DTYPES[case.dtype]
    shape = (num_blocks, bs, NUM_KV_HEADS, case.head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    return Paged(k_cache, v_cache, tables.to(torch.int32))


def assert_matches(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


def check_decode(case: Case) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(case_id(case).encode()))
    dtype = DTYPES[case.dtype]
    lens = context_lens(case.context, case.block_size)
    paged = make_paged(case, lens, gen)
    heads = NUM_KV_HEADS * case.group
    query = torch.randn(len(lens), heads, case.head_dim, generator=gen).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    scale = 1 / math.sqrt(case.head_dim)

    out = ops.paged_decode_attention(
        query, paged.k_cache, paged.v_cache, paged.block_tables, seq_lens, scale
    )
    expected = reference.decode_attention(
        query.float(),
        paged.k_cache.float(),
        paged.v_cache.float(),
        paged.block_tables,
        seq_lens,
        scale,
    )
    assert_matches(out, expected, dtype)


def check_prefill(case: Case) -> None:
    """Sequence 0 is a whole prompt, 1 a chunk extending a cached prefix, 2 a single token."""
    gen = torch.Generator().manual_seed(zlib.crc32(case_id(case).encode()))
    dtype = DTYPES[case.dtype]
    lens = context_lens(case.context, case.block_size)
    q_lens = [lens[0], min(lens[1], 5), 1]
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    paged = make_paged(case, lens, gen)
    heads = NUM_KV_HEADS * case.group
    query = torch.randn(starts[-1], heads, case.head_dim, generator=gen).to(dtype)
    scale = 1 / math.sqrt(case.head_dim)

    out = ops.paged_prefill_attention(
        query,
        paged.k_cache,
        paged.v_cache,
        paged.block_tables,
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32),
        max(q_lens),
        scale,
    )
    expected = reference.prefill_attention(
        query.float(),
        paged.k_cache.float(),
        paged.v_cache.float(),
        paged.block_tables,
        lens,
        starts,
        scale,
    )
    assert_matches(out, expected, dtype)


def test_pairwise_cases_cover_every_pair() -> None:
    names = list(FACTORS)
    for a, b in combinations(range(len(names)), 2):
        seen = {(case[a], case[b]) for case in PAIRWISE}
        assert seen == set(product(FACTORS[names[a]], FACTORS[names[b]])), (names[a], names[b])
    assert len(PAIRWISE) <= 24


@pytest.mark.parametrize("case", PAIRWISE, ids=case_id)
def test_decode_matches_reference(case: Case) -> None:
    check_decode(case)


@pytest.mark.parametrize("case", PAIRWISE, ids=case_id)
def test_prefill_matches_reference(case: Case) -> None:
    check_prefill(case)


@pytest.mark.triton_full
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_decode_full_grid(case: Case) -> None:
    check_decode(case)


@pytest.mark.triton_full
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_prefill_full_grid(case: Case) -> None:
    check_prefill(case)


@pytest.mark.parametrize(
    "head_dim,group", [(32, 8), (256, 1), (96, 3)], ids=["d32-g8", "d256-g1", "d96-g3"]
)
def test_other_head_dims_and_group_sizes(head_dim: int, group: int) -> None:
    """Powers of two beyond 64/128, and (masked) a head dim and a group that are not."""
    case = Case("float32", group, 16, head_dim, "edge+1", "scattered")
    check_decode(case)
    check_prefill(case)


WRITE_FACTORS: dict[str, tuple] = {
    "dtype": tuple(DTYPES),
    "source": ("same", "float32"),
    "block_size": (16, 32, 64),
    "head_dim": (64, 128),
    "kv_heads": (1, 2, 8),
}


@pytest.mark.parametrize(
    "dtype,source,block_size,head_dim,kv_heads",
    pairwise(WRITE_FACTORS),
    ids=lambda v: str(v),
)
def test_write_kv_cache_matches_reference(
    dtype: str, source: str, block_size: int, head_dim: int, kv_heads: int
) -> None:
    gen = torch.Generator().manual_seed(block_size * head_dim + kv_heads)
    cache_dtype = DTYPES[dtype]
    src_dtype = cache_dtype if source == "same" else torch.float32
    num_blocks, num_tokens = 5, 2 * block_size + 3
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    key = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(src_dtype)
    value = torch.randn(num_tokens, kv_heads, head_dim, generator=gen).to(src_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()

    ops.write_kv_cache(key, value, k_cache, v_cache, slots)
    reference.write_kv_cache(key, value, expected_k, expected_v, slots)
    if cache_dtype == torch.bfloat16 and src_dtype != cache_dtype:
        # The interpreter truncates float32 -> bfloat16 (a GPU rounds to nearest): 1 ulp.
        torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=2**-7)
        torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=2**-7)
    else:
        assert torch.equal(k_cache, expected_k)
        assert torch.equal(v_cache, expected_v)


def test_write_kv_cache_skips_slot_minus_one() -> None:
    kv_heads, head_dim, block_size = 2, 64, 16
    k_cache = torch.zeros(3, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    key = torch.ones(4, kv_heads, head_dim)
    value = torch.full((4, kv_heads, head_dim), 2.0)
    slots = torch.tensor([5, -1, 17, -1])

    ops.write_kv_cache(key, value, k_cache, v_cache, slots)
    flat_k = k_cache.view(-1, kv_heads, head_dim)
    flat_v = v_cache.view(-1, kv_heads, head_dim)
    written = torch.zeros(flat_k.shape[0], dtype=torch.bool)
    written[[5, 17]] = True
    assert torch.all(flat_k[written] == 1.0) and torch.all(flat_v[written] == 2.0)
    assert torch.all(flat_k[~written] == 0.0) and torch.all(flat_v[~written] == 0.0)


def test_kernels_accept_strided_views() -> None:
    """Query sliced out of a fused qkv tensor, a cache that is one half of a [2, ...] pool,
    a sliced block table and int64 lengths: the kernels follow strides."""
    gen = torch.Generator().manual_seed(7)
    heads, kv_heads, head_dim, block_size = 4, 2, 64, 16
    pool = torch.randn(2, 8, block_size, kv_heads, head_dim, generator=gen)
    k_cache, v_cache = pool[0], pool[1]
    tables = torch.randperm(8, generator=gen).to(torch.int32).view(2, 4)[:, 1:]
    lens = torch.tensor([20, 33])
    qkv = torch.randn(2, heads + 2 * kv_heads, head_dim, generator=gen)
    query = qkv[:, :heads]
    assert not query.is_contiguous() and not tables.is_contiguous()
    scale = 0.125

    out = ops.paged_decode_attention(query, k_cache, v_cache, tables, lens, scale)
    expected = reference.decode_attention(query, k_cache, v_cache, tables, lens, scale)
    assert_matches(out, expected, torch.float32)

    starts = torch.tensor([0, 1, 2])
    out = ops.paged_prefill_attention(query, k_cache, v_cache, tables, lens, starts, 1, scale)
    expected = reference.prefill_attention(
        query, k_cache, v_cache, tables, lens.tolist(), starts.tolist(), scale
    )
    assert_matches(out, expected, torch.float32)


def test_resolve_backend_auto_is_torch_on_cpu() -> None:
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("triton", torch.device("cpu")) == "triton"
    assert resolve_backend("torch", torch.device("cpu")) == "torch"


def test_resolve_backend_rejects_unknown_name() -> None:
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("cuda-graphs", torch.device("cpu"))  # type: ignore[arg-type]


def mixed_batch(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Two decodes (lengths 5 and 33) then a whole 20-token prompt and a 6-token chunk that
    extends a 17-token cached prefix, laid out as the runner does: decodes first."""
    heads, kv_heads, head_dim, block_size, num_blocks = 4, 2, 64, 16, 16
    decode_lens, prefill_lens, prefill_q = [5, 33], [20, 23], [20, 6]
    order = torch.randperm(num_blocks, generator=gen)
    tables = order[:12].view(4, 3)
    positions = [torch.tensor([n - 1]) for n in decode_lens]
    positions += [torch.arange(n - q, n) for n, q in zip(prefill_lens, prefill_q, strict=True)]
    slots = torch.cat(
        [
            tables[i, pos // block_size] * block_size + pos % block_size
            for i, pos in enumerate(positions)
        ]
    )
    num_tokens = slots.shape[0]
    query = torch.randn(num_tokens, heads, head_dim, generator=gen)
    key = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    value = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    (kv_cache,) = allocate_kv_cache(
        1, num_blocks, block_size, kv_heads, head_dim, torch.float32, "cpu"
    )
    kv_cache.copy_(torch.randn(kv_cache.shape, generator=gen))
    decode_tables = [tables[i, : -(-n // block_size)].tolist() for i, n in enumerate(decode_lens)]
    prefill_tables = [
        tables[2 + i, : -(-n // block_size)].tolist() for i, n in enumerate(prefill_lens)
    ]
    inputs = AttentionInputs(
        slot_mapping=slots,
        decode_seq_ids=["a", "b"],
        decode_block_tables=decode_tables,
        decode_seq_lens=decode_lens,
        prefill_block_tables=prefill_tables,
        prefill_seq_lens=prefill_lens,
        prefill_query_start_loc=[0, prefill_q[0], sum(prefill_q)],
    )
    return query, key, value, kv_cache, inputs


def test_triton_backend_matches_torch_backend_on_mixed_batch() -> None:
    query, key, value, kv_cache, inputs = mixed_batch(torch.Generator().manual_seed(3))
    torch_cache, triton_cache = kv_cache.clone(), kv_cache.clone()
    scale = 0.125
    outputs = []
    for name, cache in (("torch", torch_cache), ("triton", triton_cache)):
        backend = make_backend(name, [cache], 16)
        outputs.append(backend.forward(0, query, key, value, backend.prepare(inputs), scale))

    assert torch.equal(triton_cache, torch_cache)
    assert_matches(outputs[1], outputs[0], torch.float32)

    plain_cache = kv_cache.clone()
    meta = build_metadata(inputs, torch.device("cpu"))
    plain = paged_attention(query, key, value, plain_cache, meta, scale)
    assert torch.equal(plain_cache, torch_cache)
    assert_matches(plain, outputs[0], torch.float32)
