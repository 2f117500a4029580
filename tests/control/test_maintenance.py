"""The reclaim sweep and the memory-reserve guard on the shared server."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import datetime

import httpx

from tests.control.support import ADMIN, ServerProcess, set_settings, sse_events, state, wait_for


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def stream_body(prompt: list[int], max_tokens: int) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


async def first_event(lines: AsyncIterator[str]) -> dict:
    async for line in lines:
        if line.startswith("data: "):
            return sse_events([line])[0]
    raise AssertionError("the stream ended before its first event")


async def read_to_end(lines: AsyncIterator[str]) -> list:
    return sse_events([line async for line in lines])


async def test_leaked_sequence_is_reclaimed_by_the_scheduled_job(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    interval = 1.0
    set_settings(client, reclaim_interval_s=interval, memory_reserve=0.1)
    async with main_server.async_client() as http:
        body = stream_body(list(range(3600, 3700)), 1500)
        async with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.aiter_lines()
            request_id = (await first_event(lines))["id"]
            leak = await http.post(f"/admin/testing/leak/{request_id}", headers=ADMIN)
            assert leak.status_code == 200, leak.text
            leaked = leak.json()
            events = await read_to_end(lines)
    assert leaked["leaked"] is True
    assert leaked["blocks"] >= 7  # 100 prompt tokens and some generated ones
    assert "dropped" in events[-2]["error"]["message"]
    assert events[-1] == "[DONE]"
    assert request_id not in {r["id"] for r in state(client)["requests"]}
    leaked_at = at(leaked["at"])

    def scheduled_run_after_leak() -> dict | None:
        job = client.get("/admin/jobs", headers=ADMIN).json()["jobs"][0]
        runs = [
            r
            for r in job["last_runs"]
            if r["trigger"] == "scheduled" and at(r["at"]) > leaked_at and r["freed"] > 0
        ]
        return {"job": job, "run": runs[-1]} if runs else None

    found = wait_for(scheduled_run_after_leak, timeout=10 * interval)
    job, run = found["job"], found["run"]
    assert job["id"] == "kv_reclaim"
    assert job["interval_s"] == interval
    assert job["on_time"] is True
    assert (at(run["at"]) - leaked_at).total_seconds() <= 2 * interval
    assert run["outcome"] == "ok"
    assert run["freed"] >= leaked["blocks"]
    assert state(client)["kv"]["used"] == 0

    with sqlite3.connect(main_server.db) as db:
        rows = db.execute(
            "SELECT job_id, trigger, outcome, freed FROM maintenance_run WHERE freed > 0"
        ).fetchall()
    assert ("kv_reclaim", "scheduled", "ok", run["freed"]) in rows

    reclaimed = next(
        float(line.split()[-1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith("servedeck_reclaimed_blocks_total ")
    )
    assert reclaimed >= run["freed"]


def test_reserve_guard_evicts_cached_prefix_blocks_when_free_falls_under_it(
    client: httpx.Client,
) -> None:
    set_settings(client, memory_reserve=0.1, reclaim_interval_s=3600)
    prompt = list(range(2000, 3500))  # 1500 tokens: 93 full blocks stay cached afterwards
    response = client.post(
        "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    set_settings(client, memory_reserve=0.5)
    kv = state(client)["kv"]
    assert kv["used"] == 0
    assert kv["free"] < kv["reserved"] <= kv["free"] + kv["cached"]

    run = client.post("/admin/reclaim", headers=ADMIN).json()
    assert (run["trigger"], run["outcome"], run["freed"]) == ("manual", "ok", 0)
    assert run["evicted"] == kv["reserved"] - kv["free"]  # oldest cached blocks, no more
    assert run["free_after"] == kv["reserved"]
    assert run["reserve_breached"] is False
    after = state(client)["kv"]
    assert after["free"] == kv["reserved"]
    assert after["cached"] == kv["cached"] - run["evicted"] > 0
    assert after["free"] + after["used"] + after["cached"] == after["total"]
    last = client.get("/admin/jobs", headers=ADMIN).json()["jobs"][0]["last_runs"][0]
    assert (last["trigger"], last["evicted"]) == ("manual", run["evicted"])


async def test_reserve_holds_new_requests_back_while_running_ones_finish_and_429_when_full(
    client: httpx.Client, main_server: ServerProcess
) -> None:
    # 128 blocks, reserve 0.5 = 64: the long request takes 57 blocks and grows to 82, which
    # leaves at most 7 admissible blocks: the 150-token requests (10 blocks each) must wait.
    set_settings(client, memory_reserve=0.5, reclaim_interval_s=3600)
    needed = 10
    async with main_server.async_client() as http, AsyncExitStack() as streams:
        long_body = stream_body(list(range(10, 910)), 400)
        long_response = await streams.enter_async_context(
            http.stream("POST", "/v1/completions", json=long_body)
        )
        long_lines = long_response.aiter_lines()
        long_id = (await first_event(long_lines))["id"]
        short_responses = [
            await streams.enter_async_context(
                http.stream("POST", "/v1/completions", json=stream_body(list(range(s, s + 150)), 8))
            )
            for s in (1000, 1200)
        ]
        snap = (await http.get("/admin/state", headers=ADMIN)).json()
        rows = {r["id"]: r for r in snap["requests"]}
        assert rows[long_id]["state"] == "running", "the long request ended too early"
        held_back = [r for r in rows.values() if r["id"] != long_id]
        assert [(r["state"], r["blocks"]) for r in held_back] == [("waiting", 0)] * 2
        assert (snap["queue"]["waiting"], snap["queue"]["running"]) == (2, 1)
        kv = snap["kv"]
        assert kv["free"] + kv["cached"] >= needed  # the pool has room ...
        assert kv["free"] + kv["cached"] - kv["reserved"] < needed  # ... above the reserve not

        full = await http.post("/v1/completions", json={"prompt": "one too many", "max_tokens": 2})
        assert full.status_code == 429
        assert full.headers["retry-after"] == "1"
        assert "max_waiting=2" in full.json()["error"]["message"]

        long_events = await read_to_end(long_lines)
        results = await asyncio.gather(*(read_to_end(r.aiter_lines()) for r in short_responses))
    assert long_events[-2]["choices"][0]["finish_reason"] == "length"
    for events in results:
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert state(client)["requests"] == []
