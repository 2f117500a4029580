"""Whose a request is, at the HTTP edge (issue 27): a named key of ``--api-key-file`` is its
tenant whatever the body's ``user`` says (a client cannot claim another key's tenant); a bare
key, or no key, leaves the tenant to ``user``, else ``default``; ``priority`` is bounded and
a bad one is a 400 naming it; a live switch fcfs -> fair -> priority through the store, under
load, loses nothing. Read back from the per-tenant metrics of a real server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from control.core.api_keys import ApiKeys, tenant_of
from engine.tenants import MAX_TENANT_NAME, MAX_TENANTS
from tests.control.support import TOKEN, ServerProcess, set_settings, state, wait_for
from tests.control.test_hostile_inputs import assert_openai_error

KEYS = {"alice": "sk-alice-0c9a77d2", "bob": "sk-bob-4f0d5b1e"}
BARE = "sk-bare-77d24f0d"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def http(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    workdir = tmp_path_factory.mktemp("tenants-server")
    key_file = workdir / "api-keys"
    lines = ["# named keys, then the old bare one", *(f"{n}:{k}" for n, k in KEYS.items()), BARE]
    key_file.write_text("\n".join(lines) + "\n")
    server = ServerProcess(
        tiny_model_dir, workdir, ["--admin-token", TOKEN, "--api-key-file", str(key_file)], {}
    )
    server.start()
    with server.client() as client:
        yield client
    server.stop()


def served(http: httpx.Client) -> dict[str, float]:
    """Output tokens served by tenant, from ``/metrics``."""
    text = http.get("/metrics").text
    return {
        s.labels["tenant"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "servedeck_tenant_served_tokens"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["kind"] == "output"
    }


def complete(http: httpx.Client, key: str, tokens: int, **fields: object) -> None:
    body = {"prompt": "Hi", "max_tokens": tokens, "ignore_eos": True, **fields}
    response = http.post("/v1/completions", json=body, headers=bearer(key))
    assert response.status_code == 200, response.text


def test_a_named_key_is_its_tenant_whatever_user_says(http: httpx.Client) -> None:
    before = served(http)
    complete(http, KEYS["alice"], 3, user="bob")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "user": "alice"}
    chat["ignore_eos"] = True
    response = http.post("/v1/chat/completions", json=chat, headers=bearer(KEYS["bob"]))
    assert response.status_code == 200, response.text
    after = served(http)
    assert after["alice"] - before.get("alice", 0) == 3  # not bob's, although it said bob
    assert after["bob"] - before.get("bob", 0) == 2  # not alice's


def test_a_bare_key_leaves_the_tenant_to_user_else_default(http: httpx.Client) -> None:
    before = served(http)
    complete(http, BARE, 4, user="carol")
    complete(http, BARE, 5)
    after = served(http)
    assert after["carol"] - before.get("carol", 0) == 4
    assert after["default"] - before.get("default", 0) == 5


def test_a_wrong_key_is_401_and_counts_for_nobody(http: httpx.Client) -> None:
    before = served(http)
    response = http.post(
        "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "user": "alice"},
        headers=bearer("sk-alice"),  # a prefix of alice's key is not alice's key
    )  # fmt: skip
    assert_openai_error(response, 401, None)
    assert served(http) == before


@pytest.mark.parametrize("priority", [1001, -1001, "0", 1.5, True, None])
def test_a_bad_priority_is_400_naming_it(http: httpx.Client, priority: object) -> None:
    body = {"prompt": "Hi", "max_tokens": 1, "priority": priority}
    response = http.post("/v1/completions", json=body, headers=bearer(KEYS["alice"]))
    assert_openai_error(response, 400, "priority")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "priority": priority}
    response = http.post("/v1/chat/completions", json=chat, headers=bearer(KEYS["alice"]))
    assert_openai_error(response, 400, "priority")


def test_priority_in_bounds_is_served(http: httpx.Client) -> None:
    for priority in (-1000, 1000, 7.0):  # JSON's integer includes 7.0
        complete(http, KEYS["alice"], 1, priority=priority)


def test_without_keys_user_names_the_tenant(client: httpx.Client) -> None:
    before = served(client)
    long_name = "d" * (MAX_TENANT_NAME + 10)
    for user, tokens in (("dave", 2), (long_name, 3)):
        response = client.post(
            "/v1/completions",
            json={"prompt": "Hi", "max_tokens": tokens, "ignore_eos": True, "user": user},
        )
        assert response.status_code == 200, response.text
    after = served(client)
    assert after["dave"] - before.get("dave", 0) == 2
    assert after["d" * MAX_TENANT_NAME] - before.get("d" * MAX_TENANT_NAME, 0) == 3


def test_the_key_file_names_keys_and_refuses_ambiguity() -> None:
    keys = ApiKeys.parse("# c\n\nalice:sk-a\n  sk-bare  \nbob: sk-b\n", "f")
    assert [(k.tenant, k.secret.get_secret_value()) for k in keys.keys] == [
        ("alice", "sk-a"), (None, "sk-bare"), ("bob", "sk-b")
    ]  # fmt: skip
    assert keys.match("sk-b").tenant == "bob"  # type: ignore[union-attr]
    assert keys.match("sk-") is None and keys.match("alice:sk-a") is None
    assert tenant_of(keys.match("sk-a"), "bob") == "alice"
    assert tenant_of(keys.match("sk-bare"), "bob") == "bob"
    assert tenant_of(None, None) == "default"
    # not a name: the whole line is one bare key (today's files stay valid)
    assert ApiKeys.parse("not a name:sk-x\n", "f").keys[0].tenant is None
    for text, problem in (
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("a:k1\na:k2\n", "used twice"),
        ("a:k1\nb:k1\n", "same key"),
        ("k1\nk1\n", "same key"),
        ("".join(f"t{i}:k{i}\n" for i in range(MAX_TENANTS + 1)), f"at most {MAX_TENANTS}"),
    ):
        with pytest.raises(ValueError, match=problem):
            ApiKeys.parse(text, "f")


def test_a_live_switch_fcfs_fair_priority_under_load_loses_nothing(http: httpx.Client) -> None:
    """Through the store, on a real server, while both tenants' requests wait and run: every
    request is answered in full, each tenant's served tokens count every one of them, and the
    discipline in force is the one the answer said it stored."""
    set_settings(http, policy={"name": "continuous", "params": {"max_num_seqs": 2}})
    before = served(http)
    jobs = [("alice" if i % 3 else "bob", 40 + i % 24, i % 4) for i in range(30)]
    results: list[tuple[int, int | None, str | None]] = []

    def send(tenant: str, tokens: int, priority: int) -> None:
        body = {"prompt": "Hi there", "max_tokens": tokens, "ignore_eos": True}
        with httpx.Client(base_url=str(http.base_url), timeout=120) as own:
            r = own.post("/v1/completions", json={**body, "priority": priority},
                         headers=bearer(KEYS[tenant]))  # fmt: skip
        usage, choice = (r.json()["usage"], r.json()["choices"][0]) if r.is_success else ({}, {})
        results.append((r.status_code, usage.get("completion_tokens"), choice.get("finish_reason")))

    threads = [threading.Thread(target=send, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    switched = []
    for queue in ({"name": "fair", "weights": {"alice": 2.0}}, {"name": "priority"}):
        wait_for(lambda: state(http)["queue"]["waiting"] > 0, timeout=30)
        result = set_settings(http, queue=queue)
        assert result["status"]["state"] == "applied", result
        depths = state(http)["queue"]
        switched.append((state(http)["queue_order"]["name"], depths["waiting"] + depths["running"]))
    for thread in threads:
        thread.join(timeout=180)
    assert [name for name, _ in switched] == ["fair", "priority"]
    assert all(busy > 0 for _, busy in switched), switched  # each switch met requests in flight
    assert sorted(results) == sorted((200, tokens, "length") for _, tokens, _ in jobs)
    after = served(http)
    for tenant in KEYS:
        want = sum(tokens for t, tokens, _ in jobs if t == tenant)
        assert after[tenant] - before.get(tenant, 0) == want, tenant
    set_settings(http, queue={"name": "fcfs"})
