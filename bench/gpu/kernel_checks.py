"""Parts 1-2: each Triton kernel against ``kernels.reference`` (errors, then times).

Import this module only after ``TRITON_INTERPRET`` is settled: it imports triton."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch

from bench.gpu.shapes import Shapes
from bench.gpu.timing import bench_ms
from kernels import reference
from kernels.triton import decode, ops, prefill


def scattered_tables(lens: list[int], block_size: int, device: torch.device):
    """Block tables over a pool just big enough, blocks in random order (not adjacent)."""
    needed = [-(-n // block_size) for n in lens]
    num_blocks = sum(needed)
    order = torch.randperm(num_blocks)
    tables = torch.zeros(len(lens), max(needed), dtype=torch.int32)
    used = 0
    for i, n in enumerate(needed):
        tables[i, :n] = order[used : used + n]
        used += n
    return tables.to(device), num_blocks


def random_cache(num_blocks: int, s: Shapes, device: torch.device):
    shape = (num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
    dtype = getattr(torch, s.dtype)
    return torch.randn(shape, device=device, dtype=dtype), torch.randn(
        shape, device=device, dtype=dtype
    )


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def decode_inputs(
    s: Shapes, lens: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, K and V pools, block tables and lengths: ``paged_decode_attention``'s inputs."""
    tables, num_blocks = scattered_tables(lens, s.block_size, device)
    k_cache, v_cache = random_cache(num_blocks, s, device)
    query = torch.randn(len(lens), s.num_heads, s.head_dim, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return query.to(getattr(torch, s.dtype)), k_cache, v_cache, tables, seq_lens


def decode_bytes(s: Shapes, lens: list[int]) -> int:
    """What a decode call must read: every cached K and V row, plus the queries."""
    itemsize = 2 if s.dtype in ("bfloat16", "float16") else 4
    kv = 2 * sum(lens) * s.num_kv_heads * s.head_dim * itemsize
    return kv + len(lens) * s.num_heads * s.head_dim * itemsize


def check_write(s: Shapes, device: torch.device) -> dict[str, Any]:
    dtype = getattr(torch, s.dtype)
    num_blocks = -(-s.write_tokens // s.block_size) + 8
    k_cache, v_cache = random_cache(num_blocks, s, device)
    kv_shape = (s.write_tokens, s.num_kv_heads, s.head_dim)
    key = torch.randn(kv_shape, device=device, dtype=dtype)
    value = torch.randn(kv_shape, device=device, dtype=dtype)
    slots = torch.randperm(num_blocks * s.block_size)[: s.write_tokens]
    slots[::7] = -1
    slots = slots.to(device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ops.write_kv_cache(key, value, k_cache, v_cache, slots)
    reference.write_kv_cache(key, value, ref_k, ref_v, slots)
    exact = bool(torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v))
    run = partial(ops.write_kv_cache, key, value, k_cache, v_cache, slots)
    run_ref = partial(reference.write_kv_cache, key, value, ref_k, ref_v, slots)
    return {
        "tokens": s.write_tokens,
        "exact_match": exact,
        "triton_ms": bench_ms(run, device, s.warmup, s.iters),
        "torch_ms": bench_ms(run_ref, device, s.warmup, s.iters),
    }


def check_decode(s: Shapes, device: torch.device, copy_gbs: float | None) -> list[dict[str, Any]]:
    """Uniform contexts, then one ragged batch; errors against the reference in the kernel's
    dtype and in float32, times, and bandwidth as a share of the copy bandwidth."""
    scale = 1 / math.sqrt(s.head_dim)
    rows = []
    cases = [(f"uniform-{c}", [c] * s.decode_batch) for c in s.decode_contexts]
    ragged = torch.randint(1, max(s.decode_contexts) + 1, (s.decode_batch,))
    cases.append(("ragged", ragged.tolist()))
    for name, lens in cases:
        inputs = decode_inputs(s, lens, device)
        q, k_cache, v_cache, tables, seq_lens = inputs
        run = partial(decode.paged_decode_attention, *inputs, scale)
        run_ref = partial(reference.decode_attention, *inputs, scale)
        out, ref = run(), run_ref()
        exact = reference.decode_attention(
            q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, scale
        )
        row: dict[str, Any] = {
            "case": name,
            "batch": len(lens),
            "max_context": max(lens),
            "max_abs_err_vs_torch": max_err(out, ref),
            "max_abs_err_vs_fp32": max_err(out, exact),
            "torch_max_abs_err_vs_fp32": max_err(ref, exact),
        }
        del exact
        row["triton_ms"] = bench_ms(run, device, s.warmup, s.iters)
        row["torch_ms"] = bench_ms(run_ref, device, s.warmup, s.iters)
        nbytes = decode_bytes(s, lens)
        row["bytes_read"] = nbytes
        row["triton_gb_per_s"] = nbytes / row["triton_ms"] / 1e6
        row["speedup_vs_torch"] = row["torch_ms"] / row["triton_ms"]
        if copy_gbs:
            row["fraction_of_copy_bw"] = row["triton_gb_per_s"] / copy_gbs
        rows.append(row)
        del inputs, q, k_cache, v_cache, tables, seq_lens, run, run_ref, out, ref
    return rows


def check_prefill(s: Shapes, device: torch.device) -> dict[str, Any]:
    """Whole prompts and chunks extending a cached prefix, packed into one call."""
    seqs = [(n, n) for n in s.prefill_prompts] + [(c + q, q) for c, q in s.prefill_chunks]
    lens = [n for n, _ in seqs]
    q_lens = [q for _, q in seqs]
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    tables, num_blocks = scattered_tables(lens, s.block_size, device)
    k_cache, v_cache = random_cache(num_blocks, s, device)
    query = torch.randn(starts[-1], s.num_heads, s.head_dim, device=device)
    query = query.to(getattr(torch, s.dtype))
    seq_lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    starts_t = torch.tensor(starts, dtype=torch.int32, device=device)
    scale = 1 / math.sqrt(s.head_dim)
    run = partial(prefill.paged_prefill_attention, query, k_cache, v_cache, tables, seq_lens_t,
                  starts_t, max(q_lens), scale)  # fmt: skip
    run_ref = partial(
        reference.prefill_attention, query, k_cache, v_cache, tables, lens, starts, scale
    )
    out, ref = run(), run_ref()
    exact = reference.prefill_attention(
        query.float(), k_cache.float(), v_cache.float(), tables, lens, starts, scale
    )
    result: dict[str, Any] = {
        "seqs": [{"seq_len": n, "query_len": q} for n, q in seqs],
        "tokens": starts[-1],
        "max_abs_err_vs_torch": max_err(out, ref),
        "max_abs_err_vs_fp32": max_err(out, exact),
        "torch_max_abs_err_vs_fp32": max_err(ref, exact),
    }
    del exact
    result["triton_ms"] = bench_ms(run, device, s.warmup, s.iters)
    result["torch_ms"] = bench_ms(run_ref, device, s.warmup, max(s.iters // 4, 1))
    # Causal attention FLOPs: QK^T and PV, each 2 * head_dim per (query, visible key) pair.
    pairs = sum(q * (n - q) + q * (q + 1) / 2 for n, q in seqs)
    flops = 4 * pairs * s.num_heads * s.head_dim
    result["triton_tflop_per_s"] = flops / result["triton_ms"] / 1e9
    result["speedup_vs_torch"] = result["torch_ms"] / result["triton_ms"]
    return result
