"""The soak with faults, scaled down: bench/soak.py runs five minutes; this runs ~30 s of the
same traffic (skewed prompt lengths, dropped streams, a policy switch every second through all
four, the reclaim sweep every second) and holds the server to the same books."""

from __future__ import annotations

from bench.soak import SoakConfig, run_soak


def test_soak_with_faults_keeps_the_books(tmp_path):
    config = SoakConfig(
        duration_s=30.0,
        clients=8,
        num_prompts=48,
        warmup_s=10.0,
        max_wait_s=5.0,
        wait_slack_s=10.0,
    )
    report = run_soak(config, workdir=tmp_path)
    assert report.problems == [], report
    assert report.completed >= 60, report
    assert report.dropped >= 1, report
    assert report.switches >= 20, report
    assert report.checked_greedy == report.completed
    assert report.idle_used_blocks == 0
