"""What the engine did, measured, and how that compares with the cost model's prediction:
the guardrail's observed figures over a window of finished requests and a decision's
prediction error. Pure: no I/O, no clock reads (``control.guardrail.plan`` re-exports these).
The cost model's correction is the engine's own steps' (``sim.correction``,
``Predictor.correction``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from control.arrivals import Finished
from control.guardrail.schemas import Objectives, ObservedFigures
from control.policy.schemas import SettingPrediction
from engine.stats import percentile


class Timed(Protocol):
    """One request's latencies: a ``Finished`` record, or a simulated request's metrics."""

    @property
    def ttft(self) -> float | None: ...
    @property
    def tpot(self) -> float | None: ...


def within(request: Timed, objectives: Objectives) -> bool:
    """Whether one request met the latency objectives: what goodput counts, observed and
    predicted alike (a one-token request has no TPOT and meets a TPOT objective)."""
    ttft, tpot = request.ttft, request.tpot
    if objectives.ttft_p99_s is not None and (ttft is None or ttft > objectives.ttft_p99_s):
        return False
    return objectives.tpot_p99_s is None or tpot is None or tpot <= objectives.tpot_p99_s


def observed_figures(
    records: list[Finished],
    since: datetime,
    until: datetime,
    span_s: float,
    objectives: Objectives,
) -> ObservedFigures:
    """The figures of the requests that finished in a window ``span_s`` seconds long (rates
    per second of the window; goodput counts the requests within the latency objectives),
    of the objectives' priority class only when they name one."""
    records = [r for r in records if objectives.judged(r.priority)]
    ttfts = [r.ttft for r in records]
    tpots = [r.tpot for r in records if r.tpot is not None]
    tokens = sum(r.output_tokens for r in records)
    good = sum(1 for r in records if within(r, objectives))
    return ObservedFigures(
        since=since,
        until=until,
        requests=len(records),
        output_tokens_per_s=tokens / span_s if span_s > 0 else 0.0,
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p99_s=percentile(tpots, 99),
        goodput_rps=good / span_s if span_s > 0 else None,
    )


def prediction_error(
    observed_after: ObservedFigures, predicted: SettingPrediction
) -> dict[str, float] | None:
    """observed ÷ predicted for each figure both know (1.0 is exact); None when none does."""
    errors = {}
    for field in ("ttft_p99_s", "tpot_p99_s", "output_tokens_per_s"):
        seen, said = getattr(observed_after, field), getattr(predicted, field)
        if seen is not None and said:
            errors[field] = seen / said
    return errors or None
