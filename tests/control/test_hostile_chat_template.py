"""A checkpoint whose chat template is hostile, against a real server (issue 23, defect 2):
each way a template can fail is a 400 ``chat_template_error`` naming the cause, a render that
never ends is stopped at ``chat_template_timeout_s`` while a neighbour's requests stay fast,
and SIGTERM with such a render in flight exits promptly, its workers gone with it."""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.control.support import ServerProcess, wait_for
from tests.control.test_chat_completions import checkpoint_copy
from tests.control.test_lifecycle import metric

TIMEOUT_S = 1.0
SIGTERM_TIMEOUT_S = 4.0
"""The render timeout of the SIGTERM test's server: a window its polls cannot miss."""
MAX_OUTPUT = 4096
SLACK_S = 3.0
"""A stopped render answers within its timeout plus this (the kill, a loaded machine)."""
BYSTANDER_MAX_S = 0.5
"""A neighbour's median latency during a hostile render (alone: ~20-40 ms here)."""
IN_FLIGHT = "servedeck_chat_template_renders_in_flight"
HOSTILE = """{%- macro deeper(n) %}{{ deeper(n + 1) }}{% endmacro -%}
{%- set last = messages[-1].content -%}
{%- if last == 'loop' -%}
  {%- for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor -%}
{%- elif last == 'include' %}{% include 'other.jinja' %}
{%- elif last == 'import' %}{% import 'macros.jinja' as macros %}
{%- elif last == 'from-import' %}{% from 'macros.jinja' import m %}
{%- elif last == 'extends' %}{% extends 'base.jinja' %}
{%- elif last == 'range' %}{% for i in range(10 ** 6) %}{% endfor %}
{%- elif last == 'recursion' %}{{ deeper(0) }}
{%- elif last == 'big' %}{% for i in range(100) %}{{ 'x' * 100 }}{% endfor %}
{%- elif last == 'memory' %}{{ 'x' * (2 * 10 ** 9) }}
{%- elif last == 'error' %}{{ 1 // 0 }}
{%- elif last == 'refuse' %}{{ raise_exception('no, not this') }}
{%- endif -%}
{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}"""


@pytest.fixture(scope="module")
def hostile_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hostile-template")
    model = checkpoint_copy(tiny_model_dir, root / "hostile", HOSTILE)
    (workdir := root / "work").mkdir()
    server = ServerProcess(model, workdir, limits(), {})
    server.start()
    yield server
    server.stop()


def limits(timeout_s: float = TIMEOUT_S) -> list[str]:
    return [
        "--chat-template-timeout-s", str(timeout_s),
        "--max-chat-template-output", str(MAX_OUTPUT),
    ]  # fmt: skip


def chat(http: httpx.Client, content: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
    return http.post("/v1/chat/completions", json=body)


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def template_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "chat_template_error",
        "invalid_request_error",
        "messages",
    )
    return error["message"]


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        ("include", "cannot load other templates"),
        ("import", "cannot load other templates"),
        ("from-import", "cannot load other templates"),
        ("extends", "cannot load other templates"),
        ("range", "a range of more than 100000 items"),
        ("recursion", "recursed too deep"),
        ("big", f"more than max_chat_template_output ({MAX_OUTPUT} characters)"),
        ("memory", "ran out of memory"),
        ("error", "ZeroDivisionError"),
        ("refuse", "refused the messages: no, not this"),
    ],
)
def test_every_failure_of_the_template_is_a_400_naming_the_cause(
    hostile_server: ServerProcess, content: str, cause: str
) -> None:
    with hostile_server.client() as http:
        assert cause in template_error(chat(http, content))
        assert chat(http, "hello").status_code == 200


def test_a_render_that_never_ends_is_stopped_while_a_neighbour_stays_fast(
    hostile_server: ServerProcess,
) -> None:
    timeouts = 'servedeck_chat_template_failures_total{cause="timeout"}'
    with hostile_server.client() as http, hostile_server.client() as other:
        before = metric(http, timeouts)
        alone = [timed(lambda: chat(http, "hello")) for _ in range(5)]
        with ThreadPoolExecutor(1) as pool:
            start = time.monotonic()
            hostile = pool.submit(chat, other, "loop")
            wait_for(lambda: metric(http, IN_FLIGHT) == 1, timeout=TIMEOUT_S + SLACK_S)
            during = [timed(lambda: chat(http, "hello")) for _ in range(5)]
            completions = [
                timed(lambda: http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}))
                for _ in range(5)
            ]
            response = hostile.result()
            took = time.monotonic() - start
        assert "longer than chat_template_timeout_s (1 s)" in template_error(response)
        assert TIMEOUT_S <= took < TIMEOUT_S + SLACK_S
        print(  # the figures, with -s
            f"alone {statistics.median(alone) * 1000:.0f} ms; during: chat "
            f"{statistics.median(during) * 1000:.0f} ms, completion "
            f"{statistics.median(completions) * 1000:.0f} ms; stopped after {took:.2f} s"
        )
        assert statistics.median(during) < BYSTANDER_MAX_S
        assert statistics.median(completions) < BYSTANDER_MAX_S
        assert metric(http, timeouts) == before + 1
        assert chat(http, "hello").status_code == 200  # a new worker took the killed one's place


def test_sigterm_with_a_hostile_render_in_flight_exits_promptly(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = checkpoint_copy(tiny_model_dir, tmp_path / "hostile", HOSTILE)
    (workdir := tmp_path / "work").mkdir()
    # The render is in flight for its whole timeout: 1 s is a window a loaded machine's polls
    # can miss (the gauge read only once the render was stopped), SIGTERM_TIMEOUT_S not.
    args = [*limits(SIGTERM_TIMEOUT_S), "--drain-timeout-s", "30"]
    server = ServerProcess(model, workdir, args, {})
    server.start()
    proc = server.proc
    assert proc is not None
    try:
        children = psutil.Process(proc.pid).children()
        workers = [p for p in children if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2  # chat_template_workers' default
        with server.client() as http, ThreadPoolExecutor(1) as pool:
            hostile = pool.submit(chat, http, "loop")
            with server.client() as probe:
                wait_for(lambda: metric(probe, IN_FLIGHT) == 1, timeout=SIGTERM_TIMEOUT_S)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            took = time.monotonic() - start
            assert "chat_template_timeout_s" in template_error(hostile.result())
    finally:
        server.stop()
    assert took < SIGTERM_TIMEOUT_S + SLACK_S + 3.0  # the render's timeout, then the shutdown
    for worker in workers:
        assert not worker.is_running()
    wait_for(lambda: not ours(workdir), timeout=5)  # the killed worker's replacement too


def ours(workdir: Path) -> list[psutil.Process]:
    """Processes still running with this server's home: the server's and its workers'."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("SERVEDECK_HOME") == str(workdir):
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found
