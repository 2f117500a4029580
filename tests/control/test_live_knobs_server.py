"""A lowered cap under load on a real server: the PUT applies at a step boundary, the state
shows ``draining_to`` while more than the new cap run, then null; nothing is preempted and
every request answers the text it answers alone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.control.support import ADMIN, TOKEN, ServerProcess, set_settings, state, wait_for
from tui.models import AdminState
from tui.widgets.queue_panel import QueuePanel

REQUESTS = 8
MAX_TOKENS = 160  # long enough that the drain outlasts a slow PUT on a busy machine


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tiny_model_dir, tmp_path, ["--admin-token", TOKEN], {})
    process.start()
    yield process
    process.stop()


def complete(url: str, prompt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def console_queue(snapshot: dict[str, Any]) -> str:
    """The console's queue panel as it renders this ``/admin/state`` body."""
    panel = QueuePanel()
    panel.state = AdminState.model_validate(snapshot)
    return str(panel.render())


def test_lowering_max_num_seqs_under_load_drains(server: ServerProcess) -> None:
    prompts = [f"request {i}: the quick brown fox jumps over the lazy dog" for i in range(8)]
    with server.client(headers=ADMIN) as http, ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(complete, server.url, p) for p in prompts]
        wait_for(lambda: state(http)["scheduler"]["running"] >= 6, timeout=30)
        set_settings(http, policy={"name": "continuous", "params": {"max_num_seqs": 2}})
        snapshot = wait_for(
            lambda: (s := state(http))["scheduler"]["draining_to"] is not None and s, timeout=30
        )
        draining = snapshot["scheduler"]
        assert draining["draining_to"] == 2 and draining["running"] > 2
        assert draining["params"]["max_num_seqs"] == 2
        assert "draining to 2" in console_queue(snapshot)
        choices = [f.result(timeout=120) for f in futures]
        final = state(http)
    assert final["scheduler"]["draining_to"] is None
    assert "draining" not in console_queue(final)
    assert final["scheduler"]["preemptions"] == 0 == final["totals"]["preemptions"]
    assert [c["finish_reason"] for c in choices] == ["length"] * REQUESTS
    alone = [complete(server.url, p)["text"] for p in prompts]
    assert [c["text"] for c in choices] == alone
