"""bench/structured_cost.py's bookkeeping: which rows are constrained, and the summary."""

from __future__ import annotations

from bench.structured_cost import REQUESTS, constrained_rows, summary


def test_constrained_rows_are_spread_over_the_batch() -> None:
    assert constrained_rows(0.0) == set()
    assert constrained_rows(1.0) == set(range(REQUESTS))
    quarter = constrained_rows(0.25)
    assert len(quarter) == REQUESTS // 4 and quarter == set(range(0, REQUESTS, 4))


def test_the_summary_gives_each_share_its_median_and_spread() -> None:
    runs = [
        {"share": 0.25, "output_tok_s": v, "tpot_p50_ms_unconstrained": 2 * v}
        | {"tpot_p50_ms_constrained": None}
        for v in (10.0, 30.0, 20.0)
    ]
    quarter = summary(runs)["25%"]
    assert quarter["output_tok_s"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert quarter["tpot_p50_ms_unconstrained"]["median"] == 40.0
    assert "tpot_p50_ms_constrained" not in quarter
