"""``bench.budget_grid``: each decode cap judged against its own 2,048 row, the goal marked
only where both halves hold."""

from __future__ import annotations

from bench.budget_grid import table


def run(cap: int | None, budget: int, tok_s: float, tpot_s: float) -> dict:
    row = {"policy": "continuous", "max_prefill_tokens": budget, "output_throughput": tok_s}
    row |= {"tpot_p50": tpot_s, "ttft_p99": 1.0}
    return row if cap is None else row | {"max_num_seqs": cap}


def test_each_cap_is_judged_against_its_own_2048_row() -> None:
    doc = {
        "dynamic": {"output_throughput": 100.0, "tpot_p50": 0.010, "ttft_p99": 5.0},
        "runs": [
            run(None, 64, 180.0, 0.019),  # 90 % of 200, 1.9x: meets
            run(None, 2048, 200.0, 0.050),
            run(16, 64, 90.0, 0.019),  # 90 % of its own 100, 1.9x: meets
            run(16, 128, 99.0, 0.021),  # 2.1x: misses
            run(16, 2048, 100.0, 0.030),
        ],
    }
    lines = table(doc).splitlines()[2:]
    assert [line.rsplit("|", 2)[1].strip() for line in lines] == [
        "**meets**", "misses", "**meets**", "misses", "misses", "-"
    ]  # fmt: skip
    assert "| 16 | 64 | 90.0 | 90% | 19.0 | 1.90× |" in lines[2]
