"""The decode attention of one layer, the native paged kernel (``kernels.native``) against the
torch backend's gathered batched products, at a decode batch's shapes.

Both run through ``TorchAttentionBackend`` (``prepare`` then ``decode`` per layer) over the
same head-major pools, as the engine calls them: the torch side keeps its gathered buffers
across steps (``kernels.decode_gather``), so after a warm-up step each step copies in only
the new tokens. Each phase plays the same ``--steps`` steps (every row one token longer each
step) over ``--layers`` layers, more than the last-level cache holds, so each layer's K/V is
read cold as in a model's forward; phases alternate native, torch, native, ... so both see
the same load on a shared machine. Defaults are SmolLM2-135M's decode at batch 64, context
about 330 (9 query heads, 3 KV heads, head dim 64, blocks of 16).

    PYTHONPATH=. .venv/bin/python -m bench.native_decode_attention --dtype bfloat16
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.step_timing import CLOCKS
from engine.kv_pool import allocate_kv_cache
from kernels import native
from kernels.attention import AttentionInputs
from kernels.torch_backend import TorchAttentionBackend

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shapes:
    batch: int = 64
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    block: int = 16
    context: int = 330
    spread: int = 64
    """Row lengths are uniform in ``context ± spread / 2`` at the first step."""


def _tables(shapes: Shapes, steps: int, gen: torch.Generator) -> tuple[list[int], list[list[int]]]:
    """Each row's first length and its blocks (room for ``steps`` more tokens), on shuffled
    blocks of the pool."""
    half = shapes.spread // 2
    drawn = torch.randint(
        shapes.context - half, shapes.context + half + 1, (shapes.batch,), generator=gen
    )
    lens = sorted(int(n) for n in drawn)  # the runner sorts decode rows shortest first
    widths = [-(-(n + steps) // shapes.block) for n in lens]
    order: list[int] = torch.randperm(sum(widths), generator=gen).tolist()
    tables: list[list[int]] = []
    for width in widths:
        tables.append(order[:width])
        order = order[width:]
    return lens, tables


def _inputs(lens: list[int], tables: list[list[int]], block: int) -> AttentionInputs:
    """A decode step whose rows have ``lens`` tokens, the last one written this step."""
    slots = [tables[i][(n - 1) // block] * block + (n - 1) % block for i, n in enumerate(lens)]
    return AttentionInputs(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        decode_seq_ids=[str(i) for i in range(len(lens))],
        decode_block_tables=[t[: -(-n // block)] for t, n in zip(tables, lens, strict=True)],
        decode_seq_lens=list(lens),
        prefill_block_tables=[],
        prefill_seq_lens=[],
        prefill_query_start_loc=[0],
    )


def _phase(
    backend: TorchAttentionBackend,
    shapes: Shapes,
    lens: list[int],
    tables: list[list[int]],
    steps: int,
    layers: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    clock: Callable[[], float],
) -> tuple[float, float]:
    """One warm-up step, then ``steps`` timed ones: (ms per layer of ``decode``, ms per step
    of ``prepare``)."""
    decode_s = prepare_s = 0.0
    scale = shapes.head_dim**-0.5
    for step in range(steps + 1):
        inputs = _inputs([n + step for n in lens], tables, shapes.block)
        started = clock()
        meta = backend.prepare(inputs)
        prepared = clock() - started
        query = torch.randn(shapes.batch, shapes.heads, shapes.head_dim, generator=gen).to(dtype)
        key = torch.randn(shapes.batch, shapes.kv_heads, shapes.head_dim, generator=gen).to(dtype)
        for layer in range(layers):
            backend.write_kv(layer, key, key, meta)
            started = clock()
            backend.decode(layer, query, key, key, meta, scale)
            if step > 0:
                decode_s += clock() - started
        if step > 0:
            prepare_s += prepared
    return decode_s * 1e3 / (steps * layers), prepare_s * 1e3 / steps


def _cpu() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), ""
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=330)
    parser.add_argument("--layers", type=int, default=8, help="layers cycled (their K/V > L3)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per phase")
    parser.add_argument("--repeats", type=int, default=5, help="phases of each side")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: the process's CPU time (with one thread on a loaded machine, what it costs)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    shapes = Shapes(batch=args.batch, context=args.context)
    gen = torch.Generator().manual_seed(0)
    lens, tables = _tables(shapes, args.steps, gen)
    num_blocks = sum(len(t) for t in tables)
    pools = allocate_kv_cache(
        args.layers,
        num_blocks,
        shapes.block,
        shapes.kv_heads,
        shapes.head_dim,
        dtype,
        torch.device("cpu"),
    )
    for pool in pools:
        pool.copy_(torch.randn(pool.shape, generator=gen).to(dtype))
    kernels = native.load()
    if kernels is None:
        raise SystemExit("the native kernel does not build here (see the warning above)")
    sides = {
        f"native ({native.isa()})": TorchAttentionBackend(pools, shapes.block, native=kernels),
        "torch (gathered products)": TorchAttentionBackend(pools, shapes.block),
    }
    kv_mb = 2 * sum(lens) * shapes.kv_heads * shapes.head_dim * pools[0].element_size() / 2**20
    print(
        f"{_cpu()}, {torch.get_num_threads()} threads, {args.dtype}, batch {shapes.batch}, "
        f"lengths {lens[0]}..{lens[-1]} (mean {statistics.mean(lens):.0f}), "
        f"{shapes.heads}/{shapes.kv_heads} heads x {shapes.head_dim}, "
        f"K/V {kv_mb:.1f} MiB per layer, "
        f"{args.layers} layers, {args.steps} steps per phase, {args.clock} clock"
    )
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, backend in sides.items():
            times[name].append(
                _phase(
                    backend,
                    shapes,
                    lens,
                    tables,
                    args.steps,
                    args.layers,
                    dtype,
                    gen,
                    CLOCKS[args.clock],
                )
            )
    for name, runs in times.items():
        decode = sorted(ms for ms, _ in runs)
        prepare = statistics.median(ms for _, ms in runs)
        print(
            f"  {name:28s} decode ms/layer: median {statistics.median(decode):.3f}, "
            f"min {decode[0]:.3f}, max {decode[-1]:.3f} "
            f"({' '.join(f'{ms:.3f}' for ms, _ in runs)}); prepare ms/step {prepare:.3f}"
        )


if __name__ == "__main__":
    main()
