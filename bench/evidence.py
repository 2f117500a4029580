"""What a claim's rule reads and returns: ``Evidence`` (the runs of one bench and its burst
sizes) in, a ``Finding`` (verdict, figure, why) out; the verdict words; and the shared rule of
the multiplicative claims."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.formatting import times
from bench.ratios import Run, divide, find

if TYPE_CHECKING:
    from bench.claims import Claim

HOLDS = "holds"
SHAPE = "holds in shape only"
FAILS = "does not hold here"
MISSING = "not measured"

BAND = (0.8, 1.25)
"""A multiplicative claim "holds" when measured / claimed falls in this band."""
SHAPE_RATIO = 1.05
"""A multiplicative claim "holds in shape" when continuous wins by more than this."""


@dataclass(frozen=True, slots=True)
class Finding:
    """What a claim's rule found; ``fields`` fill measured parts of the claim's templates."""

    verdict: str
    figure: str
    why: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def missing(why: str = "runs missing", **fields: Any) -> Finding:
    return Finding(MISSING, "n/a", why, fields)


class Evidence:
    """The runs of one bench, and the burst sizes the claims are judged at."""

    def __init__(self, runs: list[Run], base: int, large: int | None) -> None:
        self.runs = runs
        self.base = base
        self.large = large

    def burst(self, policy: str, workload: str, concurrency: int | None = None) -> Run | None:
        return find(self.runs, suite="burst", policy=policy, workload=workload,
                    concurrency=concurrency or self.base)  # fmt: skip

    def throughput_ratio(self, concurrency: int | None) -> float | None:
        """Output tok/s of continuous over dynamic on the fixed-output burst."""
        cont = self.burst("continuous", "burst-fixed", concurrency)
        dyn = self.burst("dynamic", "burst-fixed", concurrency)
        if cont is None or dyn is None:
            return None
        return divide(cont["output_throughput"], dyn["output_throughput"])


def multiplier(claim: Claim, measured: float | None) -> Finding:
    """Continuous / other against the claimed factor (``multiplier_values``)."""
    lo, hi = claim["lo"], claim["hi"]
    if measured is None:
        return missing()
    figure = times(measured)
    if lo <= measured <= hi:
        return Finding(HOLDS, figure, "within the band")
    if measured > SHAPE_RATIO:
        side = "larger" if measured > hi else "smaller"
        why = f"continuous wins, but the gap is {side} than the claimed {claim['claimed']}×"
        return Finding(SHAPE, figure, why)
    return Finding(FAILS, figure, "continuous is not faster here")
