"""control/chat/render.py's pool on its own: a conversation that finds no free worker within
the timeout is refused (``RendererBusy``) rather than queued behind a hostile render, the
stopped worker is replaced, and closing the pool fails what it still holds."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.chat.render import ChatRenderer, RendererBusy
from control.chat.template import ChatTemplateError

TIMEOUT_S = 0.5
TEMPLATE = (
    "{% if messages[-1].content == 'loop' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }};{% endfor %}"
)


def conversation(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.fixture
def model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture
def one_worker() -> Iterator[ChatRenderer]:
    renderer = ChatRenderer(1, TIMEOUT_S, 4096)
    assert renderer.wait_ready()
    yield renderer
    renderer.close()


def test_no_free_worker_within_the_timeout_is_busy_and_the_stopped_one_is_replaced(
    one_worker: ChatRenderer, model: Path
) -> None:
    hostile = one_worker.submit(model, conversation("loop"), True)
    with pytest.raises(RendererBusy, match=r"stayed busy for 0\.5 s"):
        asyncio.run(one_worker.render(model, conversation("hi"), True))
    with pytest.raises(ChatTemplateError) as stopped:
        hostile.result(timeout=TIMEOUT_S + 5)
    assert stopped.value.cause == "timeout"
    assert one_worker.wait_ready()  # its replacement
    text = asyncio.run(one_worker.render(model, conversation("hi"), True))
    assert text == "user: hi;"


def test_closing_fails_what_the_pool_still_holds(one_worker: ChatRenderer, model: Path) -> None:
    hostile = one_worker.submit(model, conversation("loop"), True)
    queued = one_worker.submit(model, conversation("hi"), True)
    one_worker.close()
    for future in (hostile, queued):
        with pytest.raises(ChatTemplateError, match="shutting down") as failed:
            future.result(timeout=5)
        assert failed.value.cause == "worker_died"
    with pytest.raises(ChatTemplateError, match="shutting down"):
        one_worker.submit(model, conversation("hi"), True).result(timeout=1)


def test_a_render_worker_starts_without_torch() -> None:
    """A worker imports jinja and the template module alone: each server starts two, and a
    worker that imported torch (3.7 s) made the whole suite minutes slower."""
    code = "import sys, control.chat.render; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
