"""A cost model fitted to this engine on this machine (``servedeck calibrate``'s JSON).

A step's time is a non-negative combination of five features of its ``StepShape``:

- ``constant``: one per step (launch, sampling, the runner's own preparation);
- ``prefill_tokens``: new prefill tokens (the linear layers: weights × tokens);
- ``prefill_attention``: query-key pairs of the prefill chunks; a chunk of ``t`` tokens over
  ``c`` cached ones computes ``t·c + t(t+1)/2`` pairs (causal), so long contexts cost more;
- ``decode_rows``: decode rows (linear layers, one token each);
- ``decode_context``: the summed context the decode rows read (the K/V they stream).

Non-negative coefficients keep every prediction monotone in the work a step does, and the fit
weighs each measurement by its own size (relative error), so short decode steps are predicted
as well as long prefills.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.cost_model import CostModel, StepShape

FEATURES: tuple[str, ...] = (
    "constant",
    "prefill_tokens",
    "prefill_attention",
    "decode_rows",
    "decode_context",
)
FORMAT = "servedeck-calibration/2"
"""The ``format`` field a calibration file carries; ``load`` refuses any other. Version 2
records what the calibration is of (``sim.calibrations.Identity``: the model's hash, dtype,
CPU kind, attention path), the torch and servedeck versions."""
FORMAT_PREFIX = "servedeck-calibration/"


def check_format(data: dict[str, Any], name: str) -> None:
    """ValueError unless ``data`` is a calibration of this ``FORMAT``; an older one is named."""
    got = data.get("format") if isinstance(data, dict) else None
    if got == FORMAT:
        return
    if isinstance(got, str) and got.startswith(FORMAT_PREFIX):
        raise ValueError(
            f"{name}: a calibration of format {got}, this servedeck reads {FORMAT} (it records "
            "the model, dtype and CPU kind it was made on): make it again with servedeck calibrate"
        )
    raise ValueError(f"{name}: not a calibration file (format {got!r})")


def features(shape: StepShape) -> tuple[float, ...]:
    """The step's values of ``FEATURES``, in that order."""
    pairs = sum(
        t * c + t * (t + 1) / 2
        for t, c in zip(shape.prefill_tokens, shape.prefill_context, strict=True)
    )
    return (
        1.0,
        float(sum(shape.prefill_tokens)),
        float(pairs),
        float(len(shape.decode_context)),
        float(sum(shape.decode_context)),
    )


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """Non-negative least squares ``min |a x - b|, x >= 0`` (Lawson–Hanson active set)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        grad = a.T @ (b - a @ x)
        if passive.all() or grad[~passive].max(initial=0.0) <= 1e-12 * max(1.0, abs(grad).max()):
            break
        passive[np.argmax(np.where(passive, -np.inf, grad))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


@dataclass(frozen=True, slots=True)
class Fit:
    coefficients: dict[str, float]
    """Seconds per unit of each feature."""
    mean_abs_rel_error: float
    max_abs_rel_error: float


def fit(shapes: list[StepShape], seconds: list[float]) -> Fit:
    """Fit ``FEATURES`` to measured step times, minimising the relative error."""
    y = np.asarray(seconds, dtype=float)
    x = np.asarray([features(s) for s in shapes], dtype=float)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    weights = 1.0 / y
    coef = nnls(x / scale * weights[:, None], np.ones_like(y)) / scale
    rel = np.abs(x @ coef - y) / y
    return Fit(
        {name: float(c) for name, c in zip(FEATURES, coef, strict=True)},
        float(rel.mean()),
        float(rel.max()),
    )


class CalibratedModel(CostModel):
    """Predicts a step from the coefficients a ``servedeck calibrate`` file holds."""

    def __init__(self, data: dict[str, Any], name: str) -> None:
        check_format(data, name)
        self.name = name
        self.data = data
        coefs = data["fit"]["coefficients"]
        self.coefficients = tuple(float(coefs.get(f, 0.0)) for f in FEATURES)
        overhead = data.get("engine_overhead") or {}
        self.per_step_s = float(overhead.get("per_step_s", 0.0))
        self.per_seq_s = float(overhead.get("per_seq_s", 0.0))
        """The engine's own step overhead around the runner (policy, block manager)."""
        self.kv_cache_bytes: int = int(data["kv_cache"]["bytes"])
        self.kv_bytes_per_token: int = int(data["kv_cache"]["bytes_per_token"])

    @classmethod
    def load(cls, path: str | Path) -> CalibratedModel:
        path = Path(path)
        return cls(json.loads(path.read_text()), f"calibrated:{path.name}")

    def step_time(self, shape: StepShape) -> float:
        runner = sum(c * v for c, v in zip(self.coefficients, features(shape), strict=True))
        return runner + self.per_step_s + self.per_seq_s * shape.num_seqs

    def kv_cache_blocks(self, block_size: int) -> int | None:
        """The pool the calibrated engine had: its KV budget over this block size."""
        return max(1, self.kv_cache_bytes // (self.kv_bytes_per_token * block_size))
