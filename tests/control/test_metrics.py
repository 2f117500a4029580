"""``GET /metrics``: a plain route exposing every servedeck metric."""

from __future__ import annotations

import httpx

NAMES = {
    "servedeck_requests_running": "gauge",
    "servedeck_requests_waiting": "gauge",
    "servedeck_requests_constrained": "gauge",
    "servedeck_kv_blocks": "gauge",
    "servedeck_kv_usage_ratio": "gauge",
    "servedeck_kv_reserve_ratio": "gauge",
    "servedeck_time_to_first_token_seconds": "histogram",
    "servedeck_time_per_output_token_seconds": "histogram",
    "servedeck_e2e_request_latency_seconds": "histogram",
    "servedeck_prompt_tokens_total": "counter",
    "servedeck_generation_tokens_total": "counter",
    "servedeck_preemptions_total": "counter",
    "servedeck_engine_step_seconds_total": "counter",
    "servedeck_engine_step_cpu_seconds_total": "counter",
    "servedeck_reclaimed_blocks_total": "counter",
    "servedeck_reclaim_runs_total": "counter",
    "servedeck_policy_info": "gauge",
    "servedeck_policy_updates_total": "counter",
}


def samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def types(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            found[name] = kind
    return found


def test_metrics_is_a_plain_route_with_every_name(client: httpx.Client) -> None:
    before = samples(client.get("/metrics").text)
    completion = {"prompt": "Metrics, please", "max_tokens": 5, "temperature": 0}
    assert client.post("/v1/completions", json=completion).status_code == 200

    response = client.get("/metrics", follow_redirects=False)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    declared = types(text)
    for name, kind in NAMES.items():
        assert declared.get(name) == kind, f"{name} is not exposed as a {kind}"
    after = samples(text)
    for state in ("free", "used", "cached"):
        assert f'servedeck_kv_blocks{{state="{state}"}}' in after
    assert (
        after["servedeck_generation_tokens_total"]
        >= before["servedeck_generation_tokens_total"] + 5
    )
    assert after["servedeck_prompt_tokens_total"] > before["servedeck_prompt_tokens_total"]
    stepped = "servedeck_engine_step_seconds_total", "servedeck_engine_step_cpu_seconds_total"
    wall, cpu = (after[name] - before[name] for name in stepped)
    assert wall > 0 and 0 < cpu <= wall * 1.05 + 0.01  # the thread's CPU within its wall time
    ttft = "servedeck_time_to_first_token_seconds_count"
    assert after[ttft] == before[ttft] + 1
    assert (
        after["servedeck_e2e_request_latency_seconds_count"]
        == before["servedeck_e2e_request_latency_seconds_count"] + 1
    )
    info = [k for k, v in after.items() if k.startswith("servedeck_policy_info{") and v == 1]
    health = client.get("/health").json()  # the shared server: other tests switch its policy
    policy, version = health["policy"], health["version"]
    assert info == [f'servedeck_policy_info{{policy="{policy}",version="{version}"}}']
    assert 0 <= after["servedeck_kv_reserve_ratio"] <= 0.5
