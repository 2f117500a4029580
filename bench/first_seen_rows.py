"""Does a row count the product has not seen before cost extra? (issue 40, step 2's open
question: oneDNN builds a primitive per new input shape, and a step's row count changes every
step, which ``bench.linear_products``' fixed shapes never pay.)

For each shape, the engine's own ``Product`` (plain ``F.linear``, and oneDNN's packed weight):
a fixed row count run again and again, then ``--counts`` row counts never used before in the
process (one call each: a first-seen shape), then the same counts once more (seen again). Times
are per call scaled to the fixed count's rows, in the process's CPU time on one thread, so the
machine's other load stays out of them.

``PYTHONPATH=. .venv/bin/python -m bench.first_seen_rows [--rows 320] [--counts 40]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from engine.model.products import Product, ProductPlan

SHAPES = {"q/k/v": (960, 576), "gate/up": (3072, 576), "down": (576, 1536), "lm-head": (49152, 576)}
"""SmolLM2-135M's products, out × in features (as in ``bench.linear_products``)."""


def per_call_ms(fn: Callable[[torch.Tensor], torch.Tensor], xs: list[torch.Tensor]) -> float:
    started = time.process_time()
    for x in xs:
        fn(x)
    return (time.process_time() - started) * 1e3 / len(xs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--counts", type=int, default=40, help="first-seen row counts a kind")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    fresh = iter(range(args.rows + 1, args.rows + 1 + 10 * args.counts))  # never used twice
    print(f"ms per call at {args.rows} rows (CPU time, 1 thread): fixed / first seen / again")
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features)
        kinds = {
            "linear": Product(weight),
            "onednn": Product(weight, plan=ProductPlan("onednn", narrow_max_rows=None)),
        }
        cells = []
        for kind, product in kinds.items():
            fixed = [torch.randn(args.rows, in_features)] * 20
            product(fixed[0])  # its primitive made before the timing
            counts = [next(fresh) for _ in range(args.counts)]
            xs = [torch.randn(m, in_features) for m in counts]
            scale = args.rows / statistics.mean(counts)
            first = per_call_ms(product, xs) * scale
            again = per_call_ms(product, xs) * scale
            cells.append(f"{kind} {per_call_ms(product, fixed):.2f} / {first:.2f} / {again:.2f}")
        print(f"{name} {out_features}×{in_features}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
