"""The SLO guardrail against a real server: its config (defaults, 422s, stored and audited
revisions), off without a cost model, and with the roofline profile and live traffic: shadow
records and stores no version, ``on`` applies one (actor ``guardrail``, the prediction quoted)
and the rate limit holds the next, ``off`` stops everything, an active schedule window wins;
``observed_after`` and ``prediction_error`` are filled after the interval.

The proposal is forced by the knob that matters most: the person's setting has a 16-token step
budget (a 200-token prompt takes 13 steps to prefill) and the bounds allow up to the engine cap,
under a TTFT objective no setting can meet, so the one with the largest margin (the shortest
predicted TTFT, whatever the correction) is proposed every time the budget is 16.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.control.admin_cli_support import server_fixture
from tests.control.support import ADMIN, ServerProcess, set_settings, wait_for

COST_MODEL = "a100-80g/llama3-8b"
ENGINE_TOKEN_CAP = 2048  # EngineConfig.max_num_batched_tokens's default
NO_COST_MODEL = "off: the server has no cost model (start it with --cost-model)"
SMALL_BUDGET = {"name": "continuous", "params": {"max_num_batched_tokens": 16}}


def config(mode: str, **extra: Any) -> dict[str, Any]:
    """A guardrail PUT body: an impossible TTFT objective, the step budget bounded 16-cap."""
    return {
        "mode": mode,
        "objectives": {"ttft_p99_s": 1e-6},
        "bounds": {
            "policies": ["continuous"],
            "max_num_batched_tokens": {"min": 16, "max": ENGINE_TOKEN_CAP},
        },
        "interval_s": 1.0,
        "window_s": 120.0,
        "min_change_interval_s": 3600.0,
        "hysteresis": 0.0,
        "max_candidates": 4,
        "reason": f"test: {mode}",
    } | extra


def put(http: httpx.Client, body: dict[str, Any], actor: str = "ops") -> dict[str, Any]:
    response = http.put(
        "/admin/guardrail", json=body, headers={**ADMIN, "X-Servedeck-Actor": actor}
    )
    assert response.status_code == 200, response.text
    return response.json()


def get(http: httpx.Client) -> dict[str, Any]:
    response = http.get("/admin/guardrail", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def decisions(http: httpx.Client) -> list[dict[str, Any]]:
    response = http.get("/admin/guardrail/decisions", headers=ADMIN, params={"limit": 200})
    assert response.status_code == 200, response.text
    return response.json()["items"]


def policy(http: httpx.Client) -> dict[str, Any]:
    response = http.get("/admin/policy", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


def new_decision(http: httpx.Client, after: int, timeout: float = 20) -> dict[str, Any]:
    """The first decision with an id above ``after``."""

    def found() -> dict[str, Any] | None:
        newer = [d for d in decisions(http) if d["id"] > after]
        return min(newer, key=lambda d: d["id"]) if newer else None

    return wait_for(found, timeout, 0.2)


def newest_id(http: httpx.Client) -> int:
    return max((d["id"] for d in decisions(http)), default=0)


# -- config, on the shared server (no cost model) --------------------------------------------


def test_defaults_are_off_at_revision_0(client: httpx.Client) -> None:
    view = get(client)
    assert view["config"]["mode"] == "off"
    assert (view["revision"], view["actor"], view["reason"]) == (0, None, None)
    assert view["status"]["active"] is False
    assert view["status"]["cost_model"] is None


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"mode": "auto"}, ["body", "mode"]),
        (
            {"bounds": {"max_num_seqs": {"min": 64, "max": 16}}},
            ["body", "bounds", "max_num_seqs"],
        ),
        (
            {"bounds": {"max_num_seqs": {"min": 16, "max": 100_000}}},
            ["body", "bounds", "max_num_seqs", "max"],
        ),
        (
            {"bounds": {"max_num_batched_tokens": {"min": 16, "max": 4096}}},
            ["body", "bounds", "max_num_batched_tokens", "max"],
        ),
        (
            {"bounds": {"max_prefill_tokens": {"min": 16, "max": 4096}}},
            ["body", "bounds", "max_prefill_tokens", "max"],
        ),
        ({"objectives": {}}, ["body", "objectives"]),
        ({"reason": None}, ["body", "reason"]),
        ({"reason": "  "}, ["body", "reason"]),
    ],
)
def test_bad_config_is_422_naming_the_field(
    client: httpx.Client, change: dict[str, Any], loc: list[str]
) -> None:
    before = get(client)["revision"]
    body = config("off") | change
    body = {k: v for k, v in body.items() if v is not None}
    response = client.put("/admin/guardrail", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["detail"]] == [loc]
    assert get(client)["revision"] == before


def test_put_stores_an_audited_revision_and_without_a_cost_model_stays_off(
    client: httpx.Client,
) -> None:
    before = get(client)["revision"]
    view = put(client, config("on", reason="keep TTFT"), actor="ops")
    assert view["revision"] == before + 1
    assert (view["actor"], view["reason"]) == ("ops", "keep TTFT")
    assert view["config"]["mode"] == "on" and view["config"]["interval_s"] == 1.0
    assert view["status"]["active"] is False
    reason = view["status"]["reason"]  # and the command that makes one (served model, threads)
    assert reason.startswith(NO_COST_MODEL[:-1]) and "`servedeck calibrate --model " in reason
    time.sleep(2.5)  # two intervals: nothing is evaluated
    again = get(client)
    assert (again["revision"], again["actor"], again["reason"]) == (before + 1, "ops", "keep TTFT")
    assert again["status"]["last_evaluation_at"] is None
    assert decisions(client) == []
    metrics = client.get("/metrics").text
    assert 'servedeck_guardrail_mode{mode="on"} 1.0' in metrics
    off = put(client, config("off", reason="kill switch"), actor="ops")
    assert off["revision"] == before + 2
    assert off["status"]["reason"] == "off: mode off (the kill switch)"


def test_guardrail_needs_the_admin_token(client: httpx.Client) -> None:
    assert client.get("/admin/guardrail").status_code == 401
    assert client.get("/admin/guardrail/decisions").status_code == 401
    assert client.put("/admin/guardrail", json=config("on")).status_code == 401
    response = client.post("/admin/guardrail", headers=ADMIN)
    assert response.status_code == 405 and response.headers["allow"] == "GET, PUT"


# -- with a cost model and traffic ------------------------------------------------------------


# A server of its own (these tests count versions) with the roofline profile.
server = server_fixture("guardrail", "--cost-model", COST_MODEL, "--prediction-timeout-s", "20")


@pytest.fixture(scope="module")
def traffic(server: ServerProcess) -> Iterator[None]:
    """Bursts of four 200-token prompts every half second until the module ends."""
    stop = threading.Event()

    def one(http: httpx.Client, n: int) -> None:
        prompt = [(n * 7 + i) % 4000 + 10 for i in range(200)]
        body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0.0}
        http.post("/v1/completions", json=body)

    def run() -> None:
        n = 0
        with server.client() as http:
            while not stop.is_set():
                burst = [threading.Thread(target=one, args=(http, n + i)) for i in range(4)]
                for thread in burst:
                    thread.start()
                for thread in burst:
                    thread.join()
                n += 4
                stop.wait(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(30)


@pytest.fixture
def http(server: ServerProcess, traffic: None) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def test_shadow_records_and_stores_no_version(http: httpx.Client) -> None:
    person = set_settings(http, policy=SMALL_BUDGET)["version"]
    put(http, config("shadow"))
    decision = new_decision(http, 0, 40)
    assert decision["outcome"] == "shadow" and decision["mode"] == "shadow"
    assert decision["reason"].startswith("shadow mode: recorded, not applied; TTFT p99 predicted")
    assert "max_num_batched_tokens 16 -> " in decision["reason"]
    assert decision["version"] is None
    assert decision["current"]["policy"] == SMALL_BUDGET
    assert decision["chosen"]["policy"]["params"]["max_num_batched_tokens"] > 16
    assert decision["predicted"]["ttft_p99_s"] < decision["predicted_current"]["ttft_p99_s"]
    assert decision["candidates"][0]["settings"] == decision["current"]
    assert decision["observed_before"]["requests"] >= 5
    assert decision["trace_requests"] >= 5 and 0.2 <= decision["correction"] <= 5.0
    status = get(http)["status"]
    assert status["active"] is True and status["cost_model"]
    assert status["observed"]["requests"] >= 5 and status["margin"] < 0
    assert policy(http)["version"] == person
    metrics = http.get("/metrics").text
    assert re.search(r'servedeck_guardrail_decisions_total\{outcome="shadow"\} [1-9]', metrics)
    assert 'servedeck_guardrail_mode{mode="shadow"} 1.0' in metrics
    assert re.search(r"servedeck_guardrail_margin -\d", metrics)


def test_observed_after_is_filled_after_the_interval(http: httpx.Client) -> None:
    first = min(decisions(http), key=lambda d: d["id"])

    def filled() -> dict[str, Any] | None:
        row = next(d for d in decisions(http) if d["id"] == first["id"])
        return row if row["observed_after"] is not None else None

    row = wait_for(filled, 20, 0.2)
    after = row["observed_after"]
    assert datetime.fromisoformat(after["since"]) == datetime.fromisoformat(row["at"])
    assert datetime.fromisoformat(after["until"]) - datetime.fromisoformat(after["since"]) == (
        timedelta(seconds=1)
    )
    if after["requests"]:  # traffic finished inside that second: compared with the prediction
        assert set(row["prediction_error"]) >= {"ttft_p99_s", "output_tokens_per_s"}
        predicted = row["predicted_current"]["ttft_p99_s"]  # shadow: the setting that stayed
        assert row["prediction_error"]["ttft_p99_s"] == pytest.approx(
            after["ttft_p99_s"] / predicted
        )
    rows = decisions(http)
    assert any(d["prediction_error"] for d in rows), "no interval with traffic was measured"


def test_on_applies_one_version_then_the_rate_limit_holds(http: httpx.Client) -> None:
    before = policy(http)["version"]
    put(http, config("on"))
    last = newest_id(http)  # from here on, every decision is under this config
    decision = new_decision(http, last)
    assert decision["outcome"] == "applied", decision["reason"]
    assert decision["version"] == before + 1
    applied = policy(http)
    assert applied["version"] == before + 1 and applied["actor"] == "guardrail"
    assert applied["reason"] == decision["reason"]
    assert applied["reason"].startswith("TTFT p99 predicted")
    assert "(objective 0.000 s)" in applied["reason"]
    assert applied["settings"] == decision["chosen"]
    assert applied["status"]["state"] == "applied"
    assert datetime.fromisoformat(get(http)["status"]["last_change_at"]) <= datetime.now(UTC)

    person = set_settings(http, policy=SMALL_BUDGET)["version"]  # a person puts it back
    held = new_decision(http, decision["id"])
    assert held["outcome"] == "rate_limited"
    assert held["reason"].startswith("rate limit: the guardrail changed the setting")
    assert held["version"] is None
    time.sleep(1.5)
    now = policy(http)
    assert (now["version"], now["actor"]) == (person, "admin")


def test_off_is_the_kill_switch(http: httpx.Client) -> None:
    view = put(http, config("off"))
    assert view["status"] == view["status"] | {
        "active": False,
        "reason": "off: mode off (the kill switch)",
    }
    rows, version = newest_id(http), policy(http)["version"]
    time.sleep(3.5)
    assert newest_id(http) == rows
    assert policy(http)["version"] == version
    assert 'servedeck_guardrail_mode{mode="off"} 1.0' in http.get("/metrics").text


def test_an_active_schedule_window_wins(http: httpx.Client) -> None:
    set_settings(http, policy={"name": "continuous"})  # the window's setting differs from it
    start = (datetime.now(UTC) + timedelta(seconds=2)).replace(microsecond=0)
    end = start + timedelta(seconds=30)
    body = {
        "cron": f"{start.minute} {start.hour} * * *",
        "cron_seconds": str(start.second),
        "until": end.strftime("%H:%M:%S"),
        "timezone": "UTC",
        "policy": SMALL_BUDGET,
        "reason": "small steps at night",
    }
    response = http.post("/admin/schedules", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    try:
        window = wait_for(lambda: (p := policy(http))["actor"] == f"schedule:{sid}" and p, 15)
        put(http, config("on", min_change_interval_s=0.0))
        last = newest_id(http)
        decision = new_decision(http, last)
        assert decision["outcome"] == "window_active"
        assert decision["reason"].startswith(f"not applied: schedule {sid}'s window is in force")
        assert decision["version"] is None
        assert get(http)["status"]["window_active"] == sid
        assert policy(http)["version"] == window["version"]
    finally:
        put(http, config("off"))
        http.delete(f"/admin/schedules/{sid}", headers=ADMIN, params={"reason": "done"})
