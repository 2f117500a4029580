"""Predictions in the server: the arrival record, ``GET /admin/trace.csv`` and the dry run's
``prediction`` (the simulator in a separate process), against real servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from textual.widgets import Input, Select, Static

from control.arrivals import ArrivalLog
from control.guardrail.prediction import (
    BUSY,
    NO_COST_MODEL,
    NO_TRAFFIC,
    TIMED_OUT,
    PredictionUnavailable,
    Predictor,
    simulate_settings,
)
from control.guardrail.schemas import Objectives
from control.policy.schemas import PolicySettings, SettingPrediction
from engine.config import EngineLimits
from engine.outputs import RequestMetrics, RequestOutput
from policies.queue import FairQueue, FcfsQueue, PriorityQueue
from policies.spec import default_spec
from sim.trace import TraceRequest, read_trace
from tests.control.support import ADMIN, TOKEN, ServerProcess
from tests.tui.conftest import poll_times, quiet_settings, wait_for
from tui.app import ConsoleApp
from tui.screens.policy_editor import PolicyEditorScreen

COST_MODEL = "a100-80g/llama3-8b"
PROMPTS = ["Hello there", "The quick brown fox jumps over", "One two three four five six seven"]


def output(arrival: float, prompt: int, generated: int, reason: str = "length") -> RequestOutput:
    return RequestOutput(
        request_id=f"r{arrival}",
        prompt_token_ids=list(range(prompt)),
        token_ids=list(range(generated)),
        new_token_ids=[],
        text="never kept",
        text_delta="",
        finish_reason=reason,
        metrics=RequestMetrics(arrival_time=arrival),
    )


def test_arrival_log_keeps_times_and_lengths_bounded_and_ordered() -> None:
    log = ArrivalLog(capacity=3)
    log.record(output(100.0, 5, 2))
    log.record(output(103.0, 7, 1, "abort"))  # aborted: not what the client asked for
    log.record(output(104.0, 7, 0, "error"))
    for arrival, prompt in ((102.5, 9), (101.0, 4), (103.5, 6)):
        log.record(output(arrival, prompt, 3, "stop"))
    assert len(log) == 3  # the oldest recorded (100.0) was dropped
    trace = log.trace()
    assert [(r.arrived_at, r.num_prefill_tokens, r.num_decode_tokens) for r in trace] == [
        (0.0, 4, 3),
        (1.5, 9, 3),
        (2.5, 6, 3),
    ]
    assert [r.arrived_at for r in log.trace(limit=2)] == [0.0, 1.0]  # re-based on its first


def complete(http: httpx.Client, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def dry_run(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = http.put(
        "/admin/policy", params={"dry_run": "true"}, json={"reason": "what if", **fields},
        headers=ADMIN,
    )  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def predicting(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("predicting"),
        ["--admin-token", TOKEN, "--cost-model", COST_MODEL, "--prediction-timeout-s", "60"],
        {},
    )
    server.start()
    yield server
    server.stop()


def test_dry_run_without_a_cost_model_says_uncalibrated_and_the_command(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    """No --cost-model and no stored calibration of the served engine: "uncalibrated", with
    the exact command that makes one (the served model, its threads)."""
    prediction = dry_run(client, policy={"name": "dynamic"})["prediction"]
    assert prediction["available"] is False
    assert prediction["current"] is None and prediction["candidate"] is None
    assert prediction["reason"].startswith("uncalibrated:")
    command = f"servedeck calibrate --model {main_server.model_dir.resolve()} --threads 1"
    assert prediction["calibrate_command"] == command
    assert f"`{command}`" in prediction["reason"] and "--cost-model" in prediction["reason"]
    assert prediction["calibration"] is None


def test_trace_csv_needs_the_admin_token(client: httpx.Client) -> None:
    assert client.get("/admin/trace.csv").status_code == 401


def test_trace_round_trips_and_the_dry_run_predicts_both_settings(
    predicting: ServerProcess, tmp_path: Path
) -> None:
    with predicting.client() as http:
        before = dry_run(http, policy={"name": "dynamic"})["prediction"]
        assert before["available"] is False and before["reason"] == (
            "no prediction: no traffic recorded yet"
        )
        usages = [complete(http, p, n) for p, n in zip(PROMPTS, (4, 7, 5), strict=True)]
        response = http.get("/admin/trace.csv", headers=ADMIN)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        path = tmp_path / "trace.csv"
        path.write_bytes(response.content)
        trace = read_trace(path)
        assert trace[0].arrived_at == 0.0
        assert [r.arrived_at for r in trace] == sorted(r.arrived_at for r in trace)
        assert sorted((r.num_prefill_tokens, r.num_decode_tokens) for r in trace) == sorted(
            (u["prompt_tokens"], u["completion_tokens"]) for u in usages
        )

        result = dry_run(http, policy={"name": "dynamic"}, memory_reserve=0.2)
        limits = EngineLimits(**{
            k: v for k, v in http.get("/admin/policy/schema", headers=ADMIN).json()[
                "engine_limits"].items() if k in EngineLimits.__dataclass_fields__
        })  # fmt: skip
        current = http.get("/admin/policy", headers=ADMIN).json()["settings"]
    prediction = result["prediction"]
    assert prediction["available"] is True, prediction
    assert prediction["cost_model"] == COST_MODEL and prediction["trace_requests"] == 3
    assert COST_MODEL in prediction["statement"] and "not measured" in prediction["statement"]
    assert prediction["calibration"] is None  # a profile, no calibration file
    # Every step scaled by the engine's own steps' observed / predicted (clamped: a GPU's
    # profile prices this CPU's steps far too fast).
    scale = prediction["correction"]
    assert scale is not None and 0.2 <= scale <= 5.0
    assert f"every step x{scale:.3g}" in prediction["statement"]
    # The figures are the simulator's own on that trace, in this process for each setting.
    expected = simulate_settings(
        COST_MODEL,
        trace,
        limits,
        [PolicySettings(**current), PolicySettings(**result["settings"])],
        float("inf"),
        scale,
    )
    for side, figures in zip(("current", "candidate"), expected, strict=True):
        assert prediction[side] == pytest.approx(figures.model_dump(mode="json")), side
        assert prediction[side]["requests"] == 3
        assert prediction[side]["output_tokens_per_s"] > 0
        assert 0 < prediction[side]["ttft_p50_s"] <= prediction[side]["ttft_p99_s"]


async def test_the_console_editor_shows_the_prediction_before_apply(
    predicting: ServerProcess,
) -> None:
    with predicting.client() as http:
        complete(http, PROMPTS[2], 4)
    app = ConsoleApp(quiet_settings(url=predicting.url, token=TOKEN))  # its 3 s timeout
    async with app.run_test(size=(140, 50)) as pilot:
        await poll_times(pilot, app, 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PolicyEditorScreen), what="editor")
        editor = app.screen
        assert isinstance(editor, PolicyEditorScreen)
        editor.query_one("#policy-name", Select).value = "dynamic"
        editor.query_one("#reason", Input).value = "what if"
        await pilot.pause()
        editor.action_dry_run()
        panel = editor.query_one("#editor-diff", Static)
        await wait_for(pilot, lambda: "candidate" in str(panel.render()), 30.0, "prediction")
        shown = str(panel.render())
    assert "policy.name" in shown  # the diff, and below it the prediction
    assert COST_MODEL in shown and "not measured" in shown
    rows = [line for line in shown.splitlines() if line.startswith(("output", "TTFT", "TPOT"))]
    assert [row.rsplit(maxsplit=2)[0] for row in rows] == [
        "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms"
    ]  # fmt: skip
    for row in rows:  # figures on both sides, never a placeholder
        now, then = row.split()[-2:]
        assert float(now) > 0 and float(then) > 0, shown


def test_a_prediction_past_its_time_limit_answers_timed_out(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = ServerProcess(
        tiny_model_dir,
        tmp_path,
        ["--admin-token", TOKEN, "--cost-model", COST_MODEL, "--prediction-timeout-s", "0.001"],
        {},
    )
    server.start()
    try:
        with server.client() as http:
            complete(http, PROMPTS[0], 3)
            prediction = dry_run(http, policy={"name": "dynamic"})["prediction"]
            assert prediction == {
                "available": False,
                "reason": TIMED_OUT,
                "cost_model": COST_MODEL,
                "calibration": None,
                "correction": None,
                "calibrate_command": None,
                "trace_requests": 1,
                "statement": TIMED_OUT,
                "current": None,
                "candidate": None,
            }
            complete(http, PROMPTS[1], 3)  # the engine serves on
    finally:
        server.stop()


# -- evaluate(): many settings in the worker, for the guardrail ---------------------------------

LIMITS = EngineLimits(
    block_size=16, num_kv_blocks=4096, max_model_len=4096, max_num_seqs=256,
    max_num_batched_tokens=2048,
)  # fmt: skip
SETTINGS = [
    PolicySettings(policy=default_spec(name), memory_reserve=0.1, reclaim_interval_s=60.0)
    for name in ("continuous", "hybrid", "dynamic")
]


@pytest.fixture(scope="module")
def predictor() -> Iterator[Predictor]:
    worker = Predictor(COST_MODEL, LIMITS, timeout_s=60.0, max_requests=100)
    yield worker
    worker.close()


def sparse_log(count: int = 6) -> ArrivalLog:
    """Requests 10 s apart: each finishes before the next arrives (no queueing)."""
    log = ArrivalLog()
    for i in range(count):
        log.record(output(100.0 + 10 * i, 300 + 50 * i, 40))
    return log


def test_evaluate_predicts_every_setting_in_the_worker(predictor: Predictor) -> None:
    assert predictor.available and predictor.name == COST_MODEL
    trace = sparse_log().trace(predictor.max_requests)
    found = predictor.evaluate(trace, SETTINGS, None)
    # the simulator's own figures for each setting, as this process computes them
    assert found == simulate_settings(COST_MODEL, trace, LIMITS, SETTINGS, float("inf"))
    for figures in found:
        assert figures.requests == 6 and figures.goodput_rps is None
        assert 0 < figures.tpot_p50_s <= figures.tpot_p99_s  # type: ignore[operator]
    assert predictor.evaluate(trace, [], None) == []


def test_scale_multiplies_every_step_time(predictor: Predictor) -> None:
    trace = sparse_log().trace()
    once = predictor.evaluate(trace, SETTINGS, None)
    twice = predictor.evaluate(trace, SETTINGS, None, scale=2.0)
    for base, slow in zip(once, twice, strict=True):
        assert slow.tpot_p99_s == pytest.approx(2 * base.tpot_p99_s, rel=1e-6)  # type: ignore[operator]
        assert slow.ttft_p99_s == pytest.approx(2 * base.ttft_p99_s, rel=1e-6)  # type: ignore[operator]
        assert slow.output_tokens_per_s < base.output_tokens_per_s


def test_goodput_counts_the_requests_within_the_objectives(predictor: Predictor) -> None:
    trace = sparse_log().trace()
    loose, tight = (
        predictor.evaluate(trace, SETTINGS[:1], Objectives(ttft_p99_s=t))[0] for t in (60.0, 1e-6)
    )
    span = 50.0 + loose.ttft_p50_s  # type: ignore[operator]
    assert 6 / (span + 1.0) < loose.goodput_rps <= 6 / span  # type: ignore[operator]
    assert tight.goodput_rps == 0.0
    ttfts = sorted(
        r.ttft_p99_s
        for r in (predictor.evaluate(trace[i : i + 1], SETTINGS[:1], None)[0] for i in range(6))
    )
    middle = Objectives(ttft_p99_s=(ttfts[2] + ttfts[3]) / 2)  # three of six within
    half = predictor.evaluate(trace, SETTINGS[:1], middle)[0]
    assert half.goodput_rps == pytest.approx(loose.goodput_rps / 2)  # type: ignore[operator]


def test_evaluate_says_why_there_is_no_prediction(predictor: Predictor) -> None:
    trace = sparse_log().trace()
    with pytest.raises(PredictionUnavailable, match="no traffic"):
        predictor.evaluate([], SETTINGS, None)
    with predictor._lock, pytest.raises(PredictionUnavailable) as busy:  # another one running
        predictor.evaluate(trace, SETTINGS, None)
    assert busy.value.reason == BUSY
    with pytest.raises(PredictionUnavailable) as late:
        predictor.evaluate(sparse_log(60).trace(), SETTINGS, None, timeout_s=0.001)
    assert late.value.reason == TIMED_OUT
    predictor.timeout_s = 0.001
    try:
        with pytest.raises(PredictionUnavailable) as late:
            predictor.evaluate(sparse_log(60).trace(), SETTINGS, None)
        assert late.value.reason == TIMED_OUT
    finally:
        predictor.timeout_s = 60.0
    assert len(predictor.evaluate(trace, SETTINGS, None)) == 3  # the worker serves on
    none = Predictor(None, LIMITS, timeout_s=1.0, max_requests=10)
    assert not none.available
    with pytest.raises(PredictionUnavailable) as missing:
        none.evaluate(trace, SETTINGS, None)
    assert missing.value.reason == NO_COST_MODEL and NO_TRAFFIC != NO_COST_MODEL


def test_trace_of_the_requests_finished_since() -> None:
    log = ArrivalLog()
    for arrival, finish in ((10.0, 11.0), (12.0, 20.0), (15.0, 16.0), (18.0, 19.5)):
        out = output(arrival, 4, 2, "stop")
        out.metrics.finish_time = finish
        log.record(out)
    # the guardrail simulates what it observed: requests that finished after 16.0
    trace = log.trace(finished_since=16.0)
    assert [r.arrived_at for r in trace] == [0.0, 6.0]  # arrived 12.0 and 18.0, re-based
    assert len(log.trace()) == 4


def two_tenant_burst() -> list[TraceRequest]:
    """A's 80 long requests first, then B's 20 (priority 0 against A's 10): a backlog in
    which the queue discipline decides who waits."""
    a = [TraceRequest(0.001 * i, 1500, 100, 0, "A", 10) for i in range(80)]
    b = [TraceRequest(0.1 + 0.001 * i, 1500, 100, 0, "B", 0) for i in range(20)]
    return a + b


def test_the_prediction_is_per_tenant_and_priority_and_simulates_the_queue(
    predictor: Predictor,
) -> None:
    trace = two_tenant_burst()
    base = SETTINGS[0]
    queues = [FcfsQueue(), FairQueue(), PriorityQueue()]
    fcfs, fair, prio = predictor.evaluate(
        trace, [base.model_copy(update={"queue": q}) for q in queues], None
    )

    def b_ttft(p: SettingPrediction) -> float:
        return next(g for g in p.tenants if g.key == "B").ttft_p50_s  # type: ignore[return-value]

    for p in (fcfs, fair, prio):
        assert {g.key for g in p.tenants} == {"A", "B"}
        assert [g.key for g in p.priorities] == ["0", "10"]  # the most urgent first
        assert sum(g.share for g in p.tenants) == pytest.approx(1.0)
        assert next(g for g in p.tenants if g.key == "B").requests == 20
    # B came last: first come, first served makes it wait for A's backlog; fair share and
    # priority (B's 0 before A's 10) serve it early
    assert b_ttft(fair) < b_ttft(fcfs) / 2 and b_ttft(prio) < b_ttft(fcfs) / 2
    # an objective of priority class 0 judges B's requests only
    judged = predictor.evaluate(trace, [base], Objectives(ttft_p99_s=60.0, priority=0))[0]
    assert judged.requests == 20 and fcfs.requests == 100
    assert judged.ttft_p99_s == next(g for g in fcfs.priorities if g.key == "0").ttft_p99_s
