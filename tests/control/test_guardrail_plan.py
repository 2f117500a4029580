"""The guardrail's planner (control/guardrail/plan.py), pure: settings, predictions and
objectives in, candidates, margins and choices out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from control.arrivals import ArrivalLog, Finished
from control.guardrail.plan import (
    assess,
    candidates,
    choose,
    margin,
    meets,
    observed_figures,
    prediction_error,
)
from control.guardrail.schemas import (
    FloatRange,
    GuardrailConfig,
    IntRange,
    KnobBounds,
    Objectives,
    ObservedFigures,
    ReserveRange,
)
from control.policy.schemas import PolicySettings, SettingPrediction
from engine.config import EngineLimits
from engine.outputs import RequestMetrics, RequestOutput
from policies.spec import check_caps, default_spec, parse_spec

LIMITS = EngineLimits(
    block_size=16, num_kv_blocks=1000, max_model_len=2048, max_num_seqs=256,
    max_num_batched_tokens=2048,
)  # fmt: skip
TTFT_1S = Objectives(ttft_p99_s=1.0)
T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def settings(name: str = "continuous", reserve: float = 0.1, **params: Any) -> PolicySettings:
    spec = parse_spec({"name": name, "params": params})
    return PolicySettings(policy=spec, memory_reserve=reserve, reclaim_interval_s=60.0)


def config(**bounds: Any) -> GuardrailConfig:
    max_candidates = bounds.pop("max_candidates", 64)
    return GuardrailConfig(
        objectives=TTFT_1S, bounds=KnobBounds(**bounds), max_candidates=max_candidates
    )


def prediction(tput: float = 800.0, ttft: float | None = 0.5, **more: Any) -> SettingPrediction:
    return SettingPrediction(
        output_tokens_per_s=tput, ttft_p50_s=ttft, ttft_p99_s=ttft, tpot_p50_s=None,
        requests=10, **more,
    )  # fmt: skip


def given(s: PolicySettings) -> dict[str, Any]:
    """The params a candidate sets (the rest follow the policy's defaults)."""
    return s.policy.params.model_dump()


def effective(s: PolicySettings) -> tuple[Any, ...]:
    params = s.policy.params.effective(LIMITS)
    return (s.policy.name, tuple(sorted(params.items())), s.memory_reserve)


# -- candidates ------------------------------------------------------------------------------

WIDE = {
    "policies": ["continuous", "hybrid"],
    "max_num_seqs": IntRange(min=16, max=256),
    "max_num_batched_tokens": IntRange(min=256, max=4096),  # above the engine cap 2048
    "single_request_below": IntRange(min=1, max=8),
    "max_wait_s": FloatRange(min=1.0, max=60.0),
    "memory_reserve": ReserveRange(min=0.10, max=0.15),
}


def assert_inside(found: list[PolicySettings], cfg: GuardrailConfig) -> None:
    """Every candidate after the first valid under the engine caps and inside every bound."""
    for s in found[1:]:
        check_caps(s.policy, LIMITS)  # raises when invalid
        params = s.policy.params.effective(LIMITS)
        assert s.policy.name in cfg.bounds.policies
        for knob in ("max_num_seqs", "max_num_batched_tokens", "single_request_below"):
            bound = getattr(cfg.bounds, knob)
            if bound is not None and knob in params:
                assert bound.min <= params[knob] <= bound.max, (knob, s)
        if cfg.bounds.max_wait_s is not None:
            assert params["max_wait_s"] is not None
            assert cfg.bounds.max_wait_s.min <= params["max_wait_s"] <= cfg.bounds.max_wait_s.max
        if cfg.bounds.memory_reserve is not None:
            bound = cfg.bounds.memory_reserve
            assert bound.min <= s.memory_reserve <= bound.max
    keys = [effective(s) for s in found]
    assert len(keys) == len(set(keys)), "a setting twice in effect"


def test_candidates_start_with_the_current_and_stay_valid_inside_the_bounds() -> None:
    current = settings("continuous", 0.1, max_num_batched_tokens=512)
    cfg = config(**WIDE)
    found = candidates(current, cfg, LIMITS)
    assert found[0] == current
    assert_inside(found, cfg)
    tokens = {given(s).get("max_num_batched_tokens") for s in found}
    # min, geometric midpoint and max of the bound, the max lowered to the engine cap
    assert {256, 724, 2048} <= tokens and 4096 not in tokens
    seqs = {given(s).get("max_num_seqs") for s in found}
    assert {16, 64} <= seqs  # the cap 256 is the default
    assert {s.policy.name for s in found} == {"continuous", "hybrid"}
    assert {0.1, 0.1225, 0.15} <= {s.memory_reserve for s in found}
    hybrid = [s for s in found if s.policy.name == "hybrid"]
    assert {1, 3, 8} <= {given(s).get("single_request_below", 4) for s in hybrid}
    # one knob at a time: each variation differs from its policy's moved-in setting once
    base = found[1]
    assert given(base) == {"max_num_batched_tokens": 512}  # already inside: unchanged
    for s in found[2:]:
        if s.policy.name == "continuous":
            moved = {k for k in {**given(s), **given(base)}
                     if given(s).get(k) != given(base).get(k)}  # fmt: skip
            moved |= {"memory_reserve"} if s.memory_reserve != base.memory_reserve else set()
            assert len(moved) == 1, s


def test_an_out_of_bounds_current_is_moved_in_and_a_knob_without_bounds_never_moves() -> None:
    current = settings("continuous", 0.3, max_num_batched_tokens=1024, max_num_seqs=200)
    cfg = config(
        policies=["continuous"],
        max_num_seqs=IntRange(min=16, max=64),
        memory_reserve=ReserveRange(min=0.1, max=0.15),
        max_wait_s=FloatRange(min=1.0, max=10.0),
    )
    found = candidates(current, cfg, LIMITS)
    assert found[0] == current
    assert found[1] == settings(
        "continuous", 0.15, max_num_batched_tokens=1024, max_num_seqs=64, max_wait_s=10.0
    )  # each knob clamped to its nearest bound (aging default 30 s above 10)
    assert_inside(found, cfg)
    assert all(given(s)["max_num_batched_tokens"] == 1024 for s in found)


def test_candidates_drop_params_above_an_engine_cap_and_duplicates_in_effect() -> None:
    current = settings("continuous", 0.1, max_num_seqs=256)  # the cap written out
    cfg = config(policies=["continuous"], max_num_seqs=IntRange(min=64, max=256))
    found = candidates(current, cfg, LIMITS)
    # 256 = the cap = current in effect: only the min and the midpoint are new
    assert [given(s).get("max_num_seqs") for s in found] == [256, 64, 128]
    too_big = settings("static", 0.1, max_batch_size=999)  # above the cap, not allowed either
    found = candidates(too_big, config(policies=["static", "dynamic"]), LIMITS)
    assert found[0] == too_big
    assert [s.policy for s in found[1:]] == [
        default_spec("static"), default_spec("dynamic")
    ]  # fmt: skip


def test_candidates_keep_to_max_candidates_taking_the_policies_in_turns() -> None:
    current = settings("hybrid", 0.3)  # outside: its moved-in setting is new
    cfg = config(max_candidates=5, **WIDE)
    found = candidates(current, cfg, LIMITS)
    assert len(found) == 5 and found[0] == current
    assert [s.policy.name for s in found[1:3]] == ["hybrid", "continuous"]  # its own first
    assert {s.policy.name for s in found[3:]} == {"hybrid", "continuous"}
    assert_inside(found, cfg)
    assert candidates(current, config(max_candidates=1, **WIDE), LIMITS) == [current]


# -- margins (the correction: tests/sim/test_correction.py) -----------------------------------


def test_margin_is_the_tightest_objective_and_none_without_figures() -> None:
    both = Objectives(ttft_p99_s=1.0, tpot_p99_s=0.1, goodput_min_rps=2.0)
    figures = prediction(ttft=0.5, tpot_p99_s=0.08, goodput_rps=3.0)
    assert margin(figures, both) == pytest.approx(0.2)  # TPOT: (0.1 - 0.08) / 0.1
    assert meets(figures, both)
    short = prediction(ttft=0.5, tpot_p99_s=0.08, goodput_rps=1.0)
    assert margin(short, both) == pytest.approx(-0.5) and not meets(short, both)
    assert margin(prediction(ttft=1.5), TTFT_1S) == pytest.approx(-0.5)
    assert margin(prediction(ttft=None), TTFT_1S) is None
    assert not meets(prediction(ttft=None), TTFT_1S)
    assert assess(settings(), prediction(ttft=None), TTFT_1S).margin < 0
    observed = ObservedFigures(
        since=T0, until=T0, requests=5, output_tokens_per_s=1.0, ttft_p99_s=0.75, tpot_p99_s=None
    )
    assert margin(observed, TTFT_1S) == pytest.approx(0.25)


def test_prediction_error_is_observed_over_predicted_where_both_are_known() -> None:
    after = ObservedFigures(
        since=T0, until=T0, requests=5, output_tokens_per_s=400.0, ttft_p99_s=0.6, tpot_p99_s=None
    )
    errors = prediction_error(after, prediction(tput=800.0, ttft=0.5, tpot_p99_s=0.02))
    assert errors == pytest.approx({"ttft_p99_s": 1.2, "output_tokens_per_s": 0.5})
    nothing = after.model_copy(update={"ttft_p99_s": None, "output_tokens_per_s": 0.0})
    assert prediction_error(nothing, prediction(tput=0.0, ttft=None)) is None


# -- choosing --------------------------------------------------------------------------------

NOW = settings("continuous", 0.1, max_num_batched_tokens=256)
BIGGER = settings("continuous", 0.1, max_num_batched_tokens=1024)
HYBRID = settings("hybrid", 0.1)
SMALL = settings("continuous", 0.1, max_num_seqs=16)


def judged(s: PolicySettings, tput: float, ttft: float) -> Any:
    return assess(s, prediction(tput=tput, ttft=ttft), TTFT_1S)


def test_the_best_meets_the_objectives_with_the_most_throughput() -> None:
    cfg = config()
    current = judged(NOW, 790.0, 3.2)
    others = [judged(BIGGER, 812.0, 0.41), judged(HYBRID, 900.0, 1.5), judged(SMALL, 500.0, 0.1)]
    choice = choose(cfg, current, others)
    assert choice is not None and choice.candidate.settings == BIGGER  # hybrid misses TTFT
    assert choice.reason == (
        "TTFT p99 predicted 0.41 s (objective 1.00 s) vs 3.20 s now; "
        "812 vs 790 output tok/s; max_num_batched_tokens 256 -> 1024"
    )
    # equal throughput: the larger margin wins
    tie = choose(cfg, current, [judged(BIGGER, 800.0, 0.9), judged(SMALL, 800.0, 0.2)])
    assert tie is not None and tie.candidate.settings == SMALL
    assert "max_num_seqs default -> 16" in tie.reason


def test_when_none_meets_the_largest_margin_wins_by_the_hysteresis() -> None:
    cfg = config()  # hysteresis 0.1
    current = judged(NOW, 790.0, 3.0)  # margin -2.0
    best = choose(cfg, current, [judged(BIGGER, 900.0, 2.5), judged(HYBRID, 100.0, 1.5)])
    assert best is not None and best.candidate.settings == HYBRID  # margin -0.5
    assert "policy continuous -> hybrid" in best.reason
    assert choose(cfg, current, [judged(BIGGER, 900.0, 2.95)]) is None  # -1.95: by 0.05 only
    assert choose(cfg, current, [judged(BIGGER, 900.0, 2.85)]) is not None  # by 0.15


def test_hysteresis_on_throughput_when_both_meet() -> None:
    cfg = config()
    current = judged(NOW, 800.0, 0.5)
    assert choose(cfg, current, [judged(BIGGER, 870.0, 0.1)]) is None  # +8.75 % < 10 %
    choice = choose(cfg, current, [judged(BIGGER, 890.0, 0.9)])
    assert choice is not None and choice.candidate.settings == BIGGER  # +11.25 %
    assert choose(cfg.model_copy(update={"hysteresis": 0.0}), current, [
        judged(BIGGER, 800.5, 0.9)
    ]) is not None  # fmt: skip
    # a candidate that misses never beats a current that meets, whatever its throughput
    assert choose(cfg, current, [judged(BIGGER, 5000.0, 1.1)]) is None


def test_one_that_meets_beats_a_current_that_misses_and_the_current_is_never_chosen() -> None:
    cfg = config(max_candidates=16)
    current = judged(NOW, 800.0, 1.01)
    choice = choose(cfg, current, [judged(BIGGER, 100.0, 0.99)])
    assert choice is not None and choice.candidate.settings == BIGGER
    same = judged(NOW, 5000.0, 0.1)  # the current setting, better predicted: no change
    assert choose(cfg, current, [same]) is None
    assert choose(cfg, current, []) is None


# -- observed figures ------------------------------------------------------------------------


def output(arrival: float, first: float, finish: float, tokens: int, reason: str) -> RequestOutput:
    times = [first + i * (finish - first) / max(tokens - 1, 1) for i in range(tokens)]
    metrics = RequestMetrics(
        arrival_time=arrival, first_token_time=first, token_times=times, finish_time=finish
    )
    return RequestOutput(
        request_id=f"r{arrival}", prompt_token_ids=[1, 2, 3], token_ids=list(range(tokens)),
        new_token_ids=[], text="", text_delta="", finish_reason=reason, metrics=metrics,
    )  # fmt: skip


def rounded(record: Finished) -> Finished:
    tpot = None if record.tpot is None else round(record.tpot, 9)
    return Finished(record.finish_time, round(record.ttft, 9), tpot, record.output_tokens)


def test_finished_requests_in_a_window_make_the_observed_figures() -> None:
    log = ArrivalLog()
    log.record(output(0.0, 0.5, 1.0, 5, "length"))  # finished before the window
    log.record(output(9.0, 10.0, 12.0, 5, "length"))  # ttft 1.0, tpot 0.5
    log.record(output(10.0, 10.2, 11.0, 9, "stop"))  # ttft 0.2, tpot 0.1
    log.record(output(10.0, 10.5, 10.5, 1, "length"))  # one token: no tpot
    log.record(output(10.0, 10.1, 11.5, 8, "abort"))  # aborted: never recorded
    log.record(output(11.0, 11.1, 21.0, 4, "stop"))  # finished after the window
    records = log.finished(5.0, 20.0)
    assert [rounded(r) for r in records] == [
        Finished(12.0, 1.0, 0.5, 5), Finished(11.0, 0.2, 0.1, 9), Finished(10.5, 0.5, None, 1)
    ]  # fmt: skip
    assert [rounded(r) for r in log.finished(12.0, 21.0)] == [Finished(21.0, 0.1, 3.3, 4)]
    figures = observed_figures(
        records, T0, T0 + timedelta(seconds=15), 15.0, Objectives(ttft_p99_s=0.6, tpot_p99_s=0.2)
    )
    assert figures.requests == 3 and figures.since == T0
    assert figures.output_tokens_per_s == pytest.approx(15 / 15.0)
    assert figures.ttft_p99_s == pytest.approx(0.2 + (0.5 - 0.2) + 0.98 * 0.5)  # interpolated
    assert figures.tpot_p99_s == pytest.approx(0.1 + 0.99 * 0.4)
    assert figures.goodput_rps == pytest.approx(2 / 15.0)  # the 1 s TTFT one missed
    empty = observed_figures([], T0, T0, 15.0, TTFT_1S)
    assert empty.requests == 0 and empty.ttft_p99_s is None and empty.goodput_rps == 0.0


def test_an_objective_of_one_priority_class_judges_that_class_only() -> None:
    records = [
        Finished(10.0, 0.1, 0.01, 10, 0),  # the interactive class: fast
        Finished(11.0, 0.2, 0.02, 10, 0),
        Finished(12.0, 9.0, 0.5, 40, 10),  # the batch class: slow
    ]
    every = observed_figures(records, T0, T0, 10.0, TTFT_1S)
    interactive = observed_figures(records, T0, T0, 10.0, Objectives(ttft_p99_s=1.0, priority=0))
    assert every.requests == 3 and every.goodput_rps == pytest.approx(2 / 10.0)
    assert interactive.requests == 2 and interactive.goodput_rps == pytest.approx(2 / 10.0)
    assert interactive.ttft_p99_s == pytest.approx(0.1 + 0.99 * 0.1)
    assert interactive.output_tokens_per_s == pytest.approx(20 / 10.0)
    with pytest.raises(ValidationError, match="priority"):
        Objectives(ttft_p99_s=1.0, priority=5000)
