"""The model's weight products, prepared once at load for this CPU (issue 40, step 2).

``F.linear`` on row-major weights asks the matrix library to lay each weight out again on
every call; vLLM's CPU path reorders each weight once into oneDNN's blocked layout instead.
Here each projection is a ``Product``: its plain weight and, where the plan says so, the same
weight reordered once by ``torch.ops.mkldnn._reorder_linear_weight`` and multiplied by
``torch.ops.mkldnn._linear_pointwise`` (the ops torch's own CPU freezing uses; any number of
rows). Which runs is chosen per shape and batch size, as measured on an AVX2 EPYC (float32,
one thread, CPU time; ``bench/linear_products.py``, docs/benchmarks.md): oneDNN's path is
1.2–2.2× ``F.linear`` from 2 to 8 rows on every SmolLM2 shape and 1.3–1.7× on the lm-head at
any batch, about equal on the square and narrowing products (o: 576×576; down: 1536 → 576)
at 64 rows and 0.85–0.95× at 320, and behind at one row (12.4 against 16.1 GFLOP/s on q/k/v).
So the packed weight runs from ``min_rows`` rows, and a product that does not widen
(out features ≤ in features) leaves it again from ``narrow_max_rows``.

Off by default (``EngineConfig.packed_products``): the whole 64-request SmolLM2 burst did not
gain from it on that CPU (output tok/s alternated with F.linear: ahead in 2 pairs, behind in 3;
docs/benchmarks.md). A step's row count changes every step, and oneDNN builds a primitive per
new shape, which the per-shape table (one fixed shape each) never pays.

The plan (``plan_products``) is a rule per dtype and CPU, not a timing at load, so the same
machine computes the same numbers every start. Where oneDNN refuses a dtype (bfloat16 without
AVX-512 BW/VL/DQ or AVX-NE-CONVERT) the plain weight stays, said once in the log. The packed
copy is extra memory (``Product.packed_bytes``, counted by ``packed_bytes``); the plain
weight stays for the tied embedding, tensor parallelism and the rows below ``min_rows``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ProductKind = Literal["linear", "onednn"]
ONEDNN_MIN_ROWS = 2
"""Rows from which the packed weight runs (one row: the plain weight, see the module)."""
ONEDNN_NARROW_MAX_ROWS = 64
"""Rows from which a product that does not widen runs on its plain weight again."""


@dataclass(frozen=True, slots=True)
class ProductPlan:
    """Which layout the projections get, and from how many rows it runs."""

    kind: ProductKind
    min_rows: int = ONEDNN_MIN_ROWS
    narrow_max_rows: int | None = ONEDNN_NARROW_MAX_ROWS
    """None: the packed weight at every batch from ``min_rows`` on, whatever the shape."""
    reason: str = ""


PLAIN = ProductPlan("linear", reason="F.linear on row-major weights")


def plan_products(dtype: torch.dtype, device: torch.device, mode: str = "auto") -> ProductPlan:
    """``mode`` ``off``: plain weights; ``onednn`` or ``auto``: oneDNN's packed layout where
    this torch has oneDNN on a CPU (``auto``: for float32 only, the dtype it was measured on;
    bfloat16's packed path is unmeasured here, ``onednn`` asks for it)."""
    if mode == "off":
        return ProductPlan("linear", reason="--packed-products off")
    if device.type != "cpu":
        return ProductPlan("linear", reason=f"not a CPU ({device.type}): the library's own")
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]  # unannotated
        return ProductPlan("linear", reason="this torch has no oneDNN")
    if mode == "auto" and dtype != torch.float32:
        return ProductPlan("linear", reason=f"auto packs float32 only ({dtype} unmeasured)")
    return ProductPlan("onednn", reason="oneDNN's blocked layout, reordered once at load")


class Product:
    """``x @ weight.T + bias`` with the weight prepared once by the plan."""

    __slots__ = ("bias", "max_rows", "min_rows", "packed", "weight")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, plan: ProductPlan = PLAIN
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.min_rows = plan.min_rows
        widens = weight.shape[0] > weight.shape[1]
        limit = None if widens else plan.narrow_max_rows
        self.max_rows = 1 << 62 if limit is None else limit
        self.packed: torch.Tensor | None = None
        if plan.kind == "onednn":
            self.packed = _onednn_pack(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed
        if packed is None or not self.min_rows <= x.shape[0] < self.max_rows:
            return F.linear(x, self.weight, self.bias)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x if x.is_contiguous() else x.contiguous(), packed, self.bias, "none", [], ""
        )
        return out

    @property
    def packed_bytes(self) -> int:
        """The packed copy's bytes (the plain weight's size; 0 where none was made)."""
        return 0 if self.packed is None else self.weight.numel() * self.weight.element_size()


_refused: set[torch.dtype] = set()


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` in oneDNN's layout; None (one log line per dtype) where oneDNN refuses it."""
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except RuntimeError as exc:
        if weight.dtype not in _refused:
            _refused.add(weight.dtype)
            log.info("oneDNN cannot pack %s weights here, F.linear instead: %s", weight.dtype, exc)
        return None
    return packed
