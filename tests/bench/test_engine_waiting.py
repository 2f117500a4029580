"""bench.engine_waiting's arithmetic (issue 40, step 4): the books of a burst are the
difference of the engine's totals, and the summary sets served against offline."""

from __future__ import annotations

from bench.engine_waiting import Books, Run, summary


def _run(mode: str, step_s: float, wall_s: float, round_: int = 0) -> Run:
    books = Books(steps=100, step_s=step_s, step_cpu_s=step_s * 0.9, output_tokens=8192)
    return Run(mode, "default", round_, 2, wall_s, books, 1.0)


def test_a_bursts_books_are_the_totals_difference() -> None:
    before, after = Books(5, 1.5, 1.0, 40), Books(105, 91.5, 73.0, 8232)
    assert after.minus(before) == Books(100, 90.0, 72.0, 8192)


def test_the_summary_sets_served_step_time_against_offline() -> None:
    runs = [_run("offline", 80.0, 82.0), _run("served", 88.0, 95.0)]
    run = runs[1]
    assert run.tok_s == 8192 / 95.0
    assert run.outside_steps_s == 95.0 - 88.0
    assert run.cpu_share == 0.9
    text = summary(runs)
    assert "default: Σ step wall served / offline 1.100" in text
    assert "| default | served | 1 | 86.2 | 88.0 | 0.90 | 7.0 | 100 |" in text
