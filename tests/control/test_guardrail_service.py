"""The guardrail's evaluation on given clocks: real SQLite (migrated), the real policy store and
schedules, the real predictor (a spawned worker, roofline a100-80g/llama3-8b) and an arrival
log fed with finished requests; the engine side of applying a version is recorded here (the
server tests drive the real engine)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from control import migrate
from control.arrivals import ArrivalLog
from control.core.db import make_engine
from control.guardrail.prediction import Predictor
from control.guardrail.schemas import GuardrailConfig, GuardrailUpdate
from control.guardrail.service import Guardrail
from control.metrics import ControlMetrics
from control.policy.checks import SettingsInvalid
from control.policy.rows import seed
from control.policy.schemas import PolicySettings, PolicyUpdate, SettingPrediction
from control.policy.store import PolicyStore
from control.schedules.store import Schedules
from engine.config import EngineLimits
from engine.outputs import RequestMetrics, RequestOutput
from policies.spec import PolicySpec, default_spec, parse_spec
from sim.trace import TraceRequest

LIMITS = EngineLimits(16, 512, 4096, 256, 2048)
COST_MODEL = "a100-80g/llama3-8b"
SMALL = parse_spec({"name": "continuous", "params": {"max_num_batched_tokens": 16}})
START = datetime(2026, 11, 30, 12, tzinfo=UTC)


def config(mode: str = "on", **extra: Any) -> GuardrailUpdate:
    """An impossible TTFT objective over a 16-to-cap step budget: the largest budget (the
    shortest predicted TTFT) is proposed whenever the budget in force is 16."""
    body = {
        "mode": mode,
        "objectives": {"ttft_p99_s": 1e-6},
        "bounds": {"policies": ["continuous"], "max_num_batched_tokens": {"min": 16, "max": 2048}},
        "interval_s": 10.0,
        "window_s": 60.0,
        "min_change_interval_s": 0.0,
        "hysteresis": 0.0,
        "max_candidates": 3,
        "reason": "test",
    }
    return GuardrailUpdate.model_validate(body | extra)


class Interleaved(Predictor):
    """The real predictor; ``between`` runs after the candidates were simulated (a change by
    someone else while the guardrail was thinking)."""

    between: Any = None

    def evaluate(self, *args: Any, **kwargs: Any) -> list[SettingPrediction]:
        predictions = super().evaluate(*args, **kwargs)
        if len(args[1]) > 1 and self.between is not None:
            self.between()
        return predictions


@pytest.fixture(scope="module")
def predictor() -> Iterator[Interleaved]:
    found = Interleaved(COST_MODEL, LIMITS, 60.0, 200)
    yield found
    found.close()


class World:
    def __init__(self, path: Path, predictor: Interleaved) -> None:
        migrate.upgrade(path)
        self.db = make_engine(path)
        with Session(self.db) as session:
            seed(session)
        self.refuse: str | None = None
        self.applied: list[int] = []
        self.metrics = ControlMetrics()
        self.store = PolicyStore(LIMITS, self.apply, self.metrics)
        self.now, self.mono = START, 1000.0
        self.schedules = Schedules(self.db, self.store, self.metrics, lambda: self.now)
        self.arrivals = ArrivalLog()
        predictor.between = None
        self.predictor = predictor
        self.guardrail = Guardrail(
            self.db,
            self.store,
            predictor,
            self.arrivals,
            self.schedules,
            self.metrics,
            clock=lambda: self.now,
            engine_clock=lambda: self.mono,
        )
        self.change(SMALL, "admin")

    def apply(self, settings: PolicySettings, version: int, timeout: float | None = None) -> None:
        if self.refuse is not None:
            raise RuntimeError(self.refuse)
        self.applied.append(version)

    def change(self, spec: PolicySpec, actor: str) -> int:
        with Session(self.db) as session:
            update = PolicyUpdate(policy=spec, reason=f"{actor}'s change")
            return self.store.update(session, update, actor).version

    def put(self, update: GuardrailUpdate) -> None:
        with Session(self.db) as session:
            self.guardrail.put(session, update, "ops")

    def traffic(self, count: int, ttft: float = 0.3) -> None:
        """``count`` 200-token requests arriving over the last seconds, all finished now."""
        for i in range(count):
            arrival = self.mono - 2.0 + i * 0.1
            first, finish = arrival + ttft, arrival + ttft + 0.4
            times = [first + k * 0.1 for k in range(5)]
            metrics = RequestMetrics(
                arrival_time=arrival, first_token_time=first, token_times=times, finish_time=finish
            )
            self.arrivals.record(
                RequestOutput(
                    request_id=f"r{arrival}",
                    prompt_token_ids=list(range(200)),
                    token_ids=list(range(5)),
                    new_token_ids=[],
                    text="",
                    text_delta="",
                    finish_reason="length",
                    metrics=metrics,
                )
            )

    def later(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.mono += seconds

    def evaluate(self) -> Any:
        return self.guardrail.evaluate(self.guardrail._current())

    def newest(self) -> tuple[int, str]:
        with Session(self.db) as session:
            row = self.store.newest(session)
            return row.version, row.actor


@pytest.fixture
def world(tmp_path: Path, predictor: Interleaved) -> World:
    return World(tmp_path / "db.sqlite", predictor)


def test_too_few_requests_evaluate_nothing(world: World) -> None:
    world.put(config())
    world.later(5.0)
    world.traffic(4)
    assert world.evaluate() is None
    with Session(world.db) as session:
        status = world.guardrail.view(session).status
        assert world.guardrail.decisions(session, 10).items == []
    assert status.active and status.observed is not None and status.observed.requests == 4
    assert status.reason == "waiting: 4 requests finished in the last 60 s (5 needed)"


def test_applied_then_observed_after_from_the_next_interval(world: World) -> None:
    world.put(config())
    world.traffic(8)
    decision = world.evaluate()
    assert decision is not None and decision.outcome == "applied"
    assert world.newest() == (decision.version, "guardrail") and world.applied[-1] == 3
    assert decision.chosen.policy.params.model_dump() == {"max_num_batched_tokens": 2048}
    assert decision.observed_before is not None and decision.observed_before.requests == 8
    assert decision.observed_after is None and decision.trace_requests == 8

    world.later(4.0)
    world.traffic(5, ttft=0.5)  # finished inside the decision's interval (10 s)
    world.later(8.5)
    world.traffic(3)  # after it
    assert world.evaluate() is None  # 2048 is the best now: nothing proposed
    with Session(world.db) as session:
        [row] = world.guardrail.decisions(session, 10).items
    after = row.observed_after
    assert after is not None and after.requests == 5
    assert (after.since, after.until) == (START, START + timedelta(seconds=10))
    assert after.ttft_p99_s == pytest.approx(0.5)
    assert row.prediction_error is not None  # against the applied setting's prediction
    assert row.predicted.ttft_p99_s is not None
    assert row.prediction_error["ttft_p99_s"] == pytest.approx(0.5 / row.predicted.ttft_p99_s)


def test_a_change_in_between_is_a_conflict(world: World) -> None:
    world.put(config())
    world.traffic(8)
    world.predictor.between = lambda: world.change(default_spec("hybrid"), "admin")
    decision = world.evaluate()
    assert decision is not None and decision.outcome == "conflict" and decision.version is None
    assert decision.reason.startswith("not applied: version is 3, not 2")
    assert world.newest() == (3, "admin")


def test_a_config_stored_meanwhile_drops_the_proposal(world: World) -> None:
    world.put(config())
    world.traffic(8)
    world.predictor.between = lambda: world.put(config("off"))
    assert world.evaluate() is None
    assert world.newest() == (2, "admin")
    with Session(world.db) as session:
        assert world.guardrail.decisions(session, 10).items == []


def test_an_engine_refusal_is_failed_with_its_version(world: World) -> None:
    world.put(config())
    world.traffic(8)
    world.refuse = "no such knob here"
    decision = world.evaluate()
    assert decision is not None and decision.outcome == "failed" and decision.version == 3
    assert decision.reason.startswith("version 3 failed: RuntimeError: no such knob here; TTFT")
    metrics = world.metrics.registry.get_sample_value
    assert metrics("servedeck_guardrail_decisions_total", {"outcome": "failed"}) == 1


def test_tick_evaluates_once_per_interval_and_never_when_off(world: World) -> None:
    world.traffic(8)
    world.guardrail.tick()  # mode off (the defaults)
    assert world.guardrail._worker is None
    world.put(config("shadow"))
    world.guardrail.tick()
    first = world.guardrail._worker
    assert first is not None
    first.join(60)
    world.later(5.0)
    world.guardrail.tick()  # within interval_s: nothing new
    assert world.guardrail._worker is first
    world.later(5.0)
    world.guardrail.tick()
    second = world.guardrail._worker
    assert second is not None and second is not first
    second.join(60)
    world.guardrail.close()
    with Session(world.db) as session:
        outcomes = [d.outcome for d in world.guardrail.decisions(session, 10).items]
    assert outcomes == ["shadow", "shadow"]
    assert world.newest() == (2, "admin")


def test_bounds_above_the_engine_caps_are_refused(world: World) -> None:
    body = config().model_dump() | {"bounds": {"max_num_seqs": {"min": 1, "max": 257}}}
    with pytest.raises(SettingsInvalid) as refused:
        world.put(GuardrailUpdate.model_validate(body))
    assert [e["loc"] for e in refused.value.errors] == [("bounds", "max_num_seqs", "max")]
    with Session(world.db) as session:
        assert world.guardrail.view(session).revision == 0
    assert GuardrailConfig().mode == "off"


def test_trace_requests_are_what_the_simulation_replayed(world: World) -> None:
    world.put(config("shadow"))
    world.traffic(6)
    decision = world.evaluate()
    assert decision is not None
    trace = world.arrivals.trace(world.predictor.max_requests)
    assert decision.trace_requests == len(trace) == 6
    assert isinstance(trace[0], TraceRequest)
    assert decision.candidates[0].settings == decision.current
