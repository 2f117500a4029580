"""A reclaim sweep's figures (``ReclaimResult``) and a fleet's sum of them."""

from __future__ import annotations

from engine.kv_stats import ReclaimResult


def test_a_sweep_over_several_pools_sums_blocks_breaches_if_any_and_lasts_as_the_slowest() -> None:
    total = ReclaimResult.total(
        iter(
            [
                ReclaimResult(2, 0, 10, 12, False, 0.004),
                ReclaimResult(1, 3, 5, 9, True, 0.010),
                ReclaimResult(0, 0, 7, 7, False, 0.002),
            ]
        )
    )
    assert total == ReclaimResult(
        freed=3, evicted=3, free_before=22, free_after=28, reserve_breached=True, duration_s=0.010
    )


def test_a_sweep_over_no_pool_did_nothing() -> None:
    assert ReclaimResult.total([]) == ReclaimResult(0, 0, 0, 0, False, 0.0)
