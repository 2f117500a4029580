"""The weight products' GFLOP/s per shape and batch size: ``F.linear`` on row-major weights
against weights packed once for this CPU, and the square-matrix probe (issue 40, step 2).

Candidates, each on the same weights and inputs, timed in alternating rounds (the machine's
speed drifts; a median over rounds compares them at the same moment):
- ``linear``: ``F.linear`` (MKL's sgemm in float32; torch's own in bfloat16);
- ``onednn``: ``torch.ops.mkldnn._reorder_linear_weight`` once, then ``_linear_pointwise``
  (oneDNN's blocked layout, any batch size; refused for bfloat16 where oneDNN lacks it);
- ``mkl@M``: ``torch.ops.mkl._mkl_reorder_linear_weight`` for exactly this batch size, then
  ``_mkl_linear`` (another batch size falls back to the plain weight inside torch);
- ``widened``: bfloat16 weights widened to float32 for each product (what a CPU without
  bfloat16 arithmetic could run instead of torch's software bfloat16).

``python -m bench.linear_products [--dtype float32 bfloat16] [--threads 2] [--out FILE]``
prints a markdown table (and writes JSON) with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.cpu import cpu_features

SHAPES: dict[str, tuple[int, int]] = {
    # SmolLM2-135M: hidden 576, 9 heads / 3 KV heads of 64, intermediate 1536, vocab 49152
    "smollm2.qkv": (960, 576),
    "smollm2.o": (576, 576),
    "smollm2.gate_up": (3072, 576),
    "smollm2.down": (576, 1536),
    "smollm2.lm_head": (49152, 576),
    # the `small` preset: hidden 512, 8 heads / 4 KV heads of 64, intermediate 1792, vocab 8192
    "small.qkv": (1024, 512),
    "small.gate_up": (3584, 512),
    "small.down": (512, 1792),
    "small.lm_head": (8192, 512),
}
"""(out features N, in features K) of every product the two models run (o is SmolLM2's)."""
BATCHES = (1, 8, 64, 256, 2048)


@dataclass(frozen=True, slots=True)
class Row:
    dtype: str
    shape: str
    n: int
    k: int
    m: int
    gflops: dict[str, float]
    """Median GFLOP/s per candidate (absent: refused here)."""
    spread: dict[str, tuple[float, float]]


Product = Callable[[], torch.Tensor]


def candidates(w: torch.Tensor, x: torch.Tensor) -> dict[str, Product]:
    """Every way to run ``x @ w.T`` here, checked against ``F.linear`` before it is timed."""
    m = x.shape[0]
    out: dict[str, Product] = {"linear": lambda: F.linear(x, w)}
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        out["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except RuntimeError:
        pass
    if w.dtype == torch.float32:
        mkl = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        out["mkl@M"] = lambda: torch.ops.mkl._mkl_linear(x, mkl, w, None, m)
    else:
        out["widened"] = lambda: F.linear(x.float(), w.float())
    want = F.linear(x.float(), w.float())
    for name, run in list(out.items()):
        if not torch.allclose(run().float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item()):
            raise AssertionError(f"{name} disagrees with F.linear")
    return out


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
"""``cpu``: the process's CPU time (with one thread), for a loaded machine."""


def time_round(
    run: Product, budget_s: float, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds per call: as many calls as fit in ``budget_s`` (at least 2), the fastest."""
    best, spent, calls = float("inf"), 0.0, 0
    while calls < 2 or spent < budget_s:
        started = clock()
        run()
        took = clock() - started
        best, spent, calls = min(best, took), spent + took, calls + 1
    return best


def measure(
    dtype: torch.dtype,
    name: str,
    n: int,
    k: int,
    m: int,
    rounds: int,
    budget_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> Row:
    gen = torch.Generator().manual_seed(n * 31 + k)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    runs = candidates(w, x)
    for run in runs.values():
        run()  # warm: primitives built, pages touched
    times: dict[str, list[float]] = {c: [] for c in runs}
    for _ in range(rounds):
        for c, run in runs.items():
            times[c].append(time_round(run, budget_s, clock))
    flop = 2 * m * n * k / 1e9
    return Row(
        str(dtype).removeprefix("torch."),
        name,
        n,
        k,
        m,
        {c: flop / statistics.median(t) for c, t in times.items()},
        {c: (flop / max(t), flop / min(t)) for c, t in times.items()},
    )


def probe(
    dtype: torch.dtype,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
    size: int = 2048,
) -> float:
    """The square-matrix probe: GFLOP/s of a ``size``-cube product, median of ``rounds``."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b
    return (
        2
        * size**3
        / 1e9
        / statistics.median(time_round(lambda: a @ b, 0.2, clock) for _ in range(rounds))
    )


def table(rows: list[Row], probes: dict[str, float]) -> str:
    names = sorted(
        {c for r in rows for c in r.gflops}, key=["linear", "onednn", "mkl@M", "widened"].index
    )
    lines = [
        f"| dtype | shape (N×K) | M | {' | '.join(names)} | best / linear | best / probe |",
        "|---" * (len(names) + 5) + "|",
    ]
    for r in rows:
        best = max(r.gflops.values())
        cells = [f"{r.gflops[c]:.1f}" if c in r.gflops else "—" for c in names]
        lines.append(
            f"| {r.dtype} | {r.shape} {r.n}×{r.k} | {r.m} | {' | '.join(cells)} | "
            f"{best / r.gflops['linear']:.2f} | {best / probes[r.dtype]:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=0.05, help="time per candidate a round")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--out", type=Path, help="JSON of every row")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = cpu_features()
    rows: list[Row] = []
    probes: dict[str, float] = {}
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        probes[dtype_name] = probe(dtype, args.rounds, CLOCKS[args.clock])
        for name in args.shapes:
            n, k = SHAPES[name]
            for m in args.batches:
                rows.append(
                    measure(dtype, name, n, k, m, args.rounds, args.budget_s, CLOCKS[args.clock])
                )
                print(
                    rows[-1].shape,
                    rows[-1].m,
                    {c: round(g, 1) for c, g in rows[-1].gflops.items()},
                    flush=True,
                )
    setup = f"{args.threads} threads; {args.clock} clock; torch {torch.__version__}"
    print(f"\nCPU: {cpu.summary}; {setup}")
    print("probe (2048³): " + ", ".join(f"{d} {g:.1f} GFLOP/s" for d, g in probes.items()))
    print(table(rows, probes))
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "cpu": cpu.summary,
                    "threads": args.threads,
                    "probe": probes,
                    "rows": [asdict(r) for r in rows],
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
