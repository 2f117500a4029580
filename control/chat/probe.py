"""A checkpoint whose chat template loops 10^10 times on one message, against a real server:
how long a normal chat request takes, what a hostile one answers and when, how slow a
neighbour's requests get meanwhile, and how long SIGTERM takes with a hostile render in flight.

    python -m control.chat.probe [--server-arg=--chat-template-timeout-s=1 ...]

Every loop is bounded in count and time; the server binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.child_server import start_server

TOKEN = "hostile-template-bench-token"
TRIGGER = "loop forever"
HOSTILE = (
    "{% if messages[-1].content == '" + TRIGGER + "' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
    "{% endfor %}"
)
BENIGN = [{"role": "user", "content": "The quick brown fox"}]
SIGTERM_WAIT_S = 45.0


def hostile_checkpoint(folder: Path) -> Path:
    from engine.checkpoint import init_model

    model = init_model(folder / "tiny", "tiny", seed=0)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": HOSTILE}))
    return model


def chat(http: httpx.Client, content: str, timeout: float = 30.0) -> tuple[int, float]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
    start = time.perf_counter()
    try:
        status = http.post("/v1/chat/completions", json=body, timeout=timeout).status_code
    except httpx.TimeoutException:
        status = 0  # the client gave up
    return status, time.perf_counter() - start


def completion(http: httpx.Client) -> float:
    start = time.perf_counter()
    response = http.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 4})
    assert response.status_code == 200, response.text
    return time.perf_counter() - start


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.2f} ms, max {max(values) * 1000:.1f} ms"


def render_overhead(model: Path, count: int) -> None:
    """A normal conversation rendered in this thread (as before) and through the pool."""
    import asyncio

    from control.chat.render import ChatRenderer
    from control.chat.template import load_chat_template

    template = load_chat_template(model)
    assert template is not None
    inline = []
    for _ in range(count):
        start = time.perf_counter()
        template.render(BENIGN)
        inline.append(time.perf_counter() - start)
    renderer = ChatRenderer(1, 2.0, 8 << 20)
    try:
        assert renderer.wait_ready()

        async def pooled() -> list[float]:
            times = []
            for _ in range(count):
                start = time.perf_counter()
                await renderer.render(model, BENIGN, True)
                times.append(time.perf_counter() - start)
            return times

        workers = asyncio.run(pooled())
    finally:
        renderer.close()
    print(f"render in this thread, {count} renders: {ms(inline)}")
    print(f"render in a worker process, {count} renders: {ms(workers)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-arg", action="append", default=[], help="passed to serve")
    parser.add_argument("--hostile-timeout", type=float, default=10.0, help="client timeout")
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hostile-template-"))
    try:
        model = hostile_checkpoint(work)
        render_overhead(model, 200)
        proc, url = start_server(model, work, TOKEN, ["--num-threads", "1", *args.server_arg])
        with httpx.Client(base_url=url, timeout=30.0) as http:
            for _ in range(3):  # warm up
                chat(http, "warm up")
            normal = [chat(http, "The quick brown fox")[1] for _ in range(args.requests)]
            print(f"normal chat (max_tokens 1), {args.requests} requests: {ms(normal)}")
            alone = [completion(http) for _ in range(args.requests)]
            print(f"bystander completion alone: {ms(alone)}")
            hostile: list[tuple[int, float]] = []
            thread = threading.Thread(
                target=lambda: hostile.append(chat(http, TRIGGER, args.hostile_timeout))
            )
            thread.start()
            time.sleep(0.2)  # the hostile render has started
            during = [completion(http) for _ in range(args.requests)]
            chats = [chat(http, "The quick brown fox")[1] for _ in range(args.requests)]
            print(f"bystander completion during a hostile render: {ms(during)}")
            print(f"bystander chat during a hostile render: {ms(chats)}")
            thread.join()
            status, took = hostile[0]
            print(f"hostile chat: status {status or 'client timeout'} after {took:.2f} s")
            thread = threading.Thread(target=lambda: chat(http, TRIGGER, args.hostile_timeout))
            thread.start()
            time.sleep(0.2)
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(SIGTERM_WAIT_S)
                print(f"SIGTERM with a hostile render in flight: exit {code} after "
                      f"{time.perf_counter() - start:.2f} s")  # fmt: skip
            except Exception:
                print(f"SIGTERM with a hostile render in flight: alive after {SIGTERM_WAIT_S} s")
                proc.kill()
                proc.wait()
            thread.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
