"""The Poisson sweep's search and its resumption (issue 40, step 6), with a fake run in place
of vLLM's client against a real server: each engine "keeps up" to a rate of its own."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.vllm import sweep as sweep_mod
from bench.vllm.side_by_side import PeerVenv, Plan
from bench.vllm.summary import Engine, RunRecord, WorkloadSpec
from bench.vllm.sweep import Search, markdown, measured, passes, summary_of

FIXTURE = Path(__file__).parent / "fixtures" / "vllm" / "burst-64-vllm-0.json"
CAPACITY: dict[Engine, float] = {"vllm": 1.3, "servedeck": 0.9}
"""The rate up to which each fake engine's TTFT p99 stays within 2 s."""


def outcomes_for(capacity: float, search: Search) -> dict[float, bool]:
    """Run the search to its end against an engine that passes every rate up to capacity."""
    outcomes: dict[float, bool] = {}
    while (rate := search.next_rate(outcomes)) is not None:
        assert rate not in outcomes, "a rate measured twice"
        outcomes[rate] = rate <= capacity
        assert len(outcomes) < 30, "the search does not end"
    return outcomes


@pytest.mark.parametrize("capacity", [0.07, 0.3, 0.5, 0.9, 1.3, 4.0, 17.0])
def test_the_search_ends_with_the_highest_passing_rate_within_its_resolution(
    capacity: float,
) -> None:
    search = Search()
    outcomes = outcomes_for(capacity, search)
    best = search.best(outcomes)
    assert best is not None and best <= capacity
    lowest_fail = min(r for r, ok in outcomes.items() if not ok)
    assert lowest_fail > capacity
    assert lowest_fail <= best * (1 + search.resolution) + 1e-9


def test_an_engine_that_keeps_up_with_nothing_stops_at_the_floor() -> None:
    search = Search(start=0.5, floor=0.05)
    outcomes = outcomes_for(0.0, search)
    assert search.best(outcomes) is None
    assert min(outcomes) >= search.floor and min(outcomes) / 2 < search.floor


def test_a_pass_above_a_failure_is_noise_and_does_not_count() -> None:
    search = Search()
    outcomes = {0.5: True, 0.75: False, 1.125: True}
    assert search.best(outcomes) == 0.5
    assert search.next_rate(outcomes) == round((0.5 * 0.75) ** 0.5, 3)


def test_a_search_that_cannot_grow_is_refused() -> None:
    with pytest.raises(ValueError, match="not a search"):
        Search(factor=1.0)


def _result(rate: float, engine: Engine) -> dict[str, object]:
    data = json.loads(FIXTURE.read_text())
    ok = rate <= CAPACITY[engine]
    return data | {
        "num_prompts": 20,
        "completed": 20,
        "failed": 0,
        "request_rate": rate,
        "p99_ttft_ms": 900.0 if ok else 9000.0,
        "output_throughput": 100.0 * min(rate, CAPACITY[engine]),
    }


class Crash(Exception):
    pass


def _plan(tmp_path: Path) -> Plan:
    peer = PeerVenv(tmp_path / "venv", "0.32.0+cpu", "2.13.0")
    model = tmp_path / "model"
    plan = Plan(peer, model, model, "float32", 2, tmp_path / "out", tmp_path)
    plan.raw.mkdir(parents=True)
    plan.logs.mkdir(parents=True)
    return plan


def test_a_stopped_sweep_resumes_where_it_stopped_and_runs_no_rate_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, search = _plan(tmp_path), Search()
    runs: list[tuple[Engine, float]] = []
    crash_after: list[int] = [5]

    def fake_run_once(plan: Plan, engine: Engine, spec: WorkloadSpec, index: int) -> RunRecord:
        assert spec.request_rate is not None and spec.num_prompts == 20
        if len(runs) == crash_after[0]:
            raise Crash
        runs.append((engine, spec.request_rate))
        name = f"{spec.name}-{engine}-{index}"
        (plan.raw / f"{name}.json").write_text(json.dumps(_result(spec.request_rate, engine)))
        return RunRecord(spec.name, engine, index, 1.0, f"raw/{name}.json", "fake")

    monkeypatch.setattr(sweep_mod, "run_once", fake_run_once)
    with pytest.raises(Crash):
        sweep_mod.sweep(plan, search, 20, 2000.0, budget_s=1e9)
    assert [engine for engine, _ in runs] == ["vllm", "servedeck"] * 2 + ["vllm"]  # alternated
    halfway = summary_of(plan, search, 20, 2000.0)
    assert not any(e.done for e in halfway.engines)

    crash_after[0] = 10_000
    assert sweep_mod.sweep(plan, search, 20, 2000.0, budget_s=1e9) == 0
    assert len(runs) == len(set(runs)), "a rate measured twice after resuming"
    summary = summary_of(plan, search, 20, 2000.0)
    best = {e.engine: e.best_rate for e in summary.engines}
    for engine, capacity in CAPACITY.items():
        assert best[engine] == search.best(outcomes_for(capacity, search))
    assert all(e.done for e in summary.engines)
    assert summary.ratio == pytest.approx(best["servedeck"] / best["vllm"])  # type: ignore[operator]
    text = markdown(summary)
    assert f"| servedeck | {best['servedeck']:g} | done |" in text
    assert "servedeck / vLLM: **" in text


def test_a_rate_is_read_back_from_its_file_and_judged(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    path = sweep_mod.result_path(plan.out, "vllm", 0.75)
    path.write_text(json.dumps(_result(0.75, "vllm") | {"failed": 1, "completed": 19}))
    (plan.raw / "sweep-rX-vllm-0.json").write_text("{}")  # unreadable: ignored, said on stderr
    found = measured(plan.out, "vllm")
    assert list(found) == [0.75]
    assert not passes(found[0.75], limit_ms=1e9)  # a failed request fails the rate, any TTFT
    assert passes(dataclasses.replace(found[0.75], failed=0, completed=20))
