"""``servedeck load``: an OpenAI-compatible load generator for a running server.

Open loop (``rate``: Poisson arrivals at R requests/s, or ``trace``: a simulator trace's
arrival times and lengths, replayed on the wall clock) or closed loop (``concurrency``: C
clients, each sending its next request when the last one ended). Prompts are token ids of the
exact length asked for and ``ignore_eos`` holds the output to its length, so a run is the load
it says it is; or, with ``chat_prompts``, real conversations sent to ``/v1/chat/completions``
(``bench.chat_prompts``; a trace then gives the arrival times only). What is sent and how a
stream is read: ``bench.load_requests``. Every request streams; the client's own clock stamps
the send, each chunk and the end, and the figures are the benchmark's (``bench.metrics``:
TTFT, TPOT, e2e, throughput over the run's duration). The rate can change while it runs
(``set_rate``; 0 pauses), which ``servedeck serve --demo-load`` uses. The command line:
``bench.load_cli``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from bench.chat_prompts import ChatPrompts
from bench.load_requests import (
    LoadRequest,
    carries_token,
    chat_request,
    events,
    first_model,
    prompt_tokens_of,
    token_request,
)
from bench.metrics import request_metrics
from bench.runner import RequestRecord
from engine.outputs import RequestMetrics
from sim.trace import TraceRequest, Uniform, read_trace

PAUSED_POLL_S = 0.2
MAX_FAILURES_KEPT = 100
DEFAULT_PROMPT_TOKENS = Uniform(32, 256)
DEFAULT_OUTPUT_TOKENS = Uniform(16, 128)


@dataclass(frozen=True)
class LoadConfig:
    url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    model: str | None = None
    rate: float | None = None
    concurrency: int | None = None
    trace: Path | None = None
    duration_s: float | None = 60.0
    prompt_tokens: Uniform = DEFAULT_PROMPT_TOKENS
    output_tokens: Uniform = DEFAULT_OUTPUT_TOKENS
    seed: int = 0
    timeout_s: float = 600.0
    keep_records: bool = True
    """False: count requests only (a load that runs for days keeps no per-request record)."""
    chat_prompts: ChatPrompts | None = None
    """Send these conversations (drawn with the seeded rng) instead of token-id prompts; the
    lengths above are then unused."""

    def __post_init__(self) -> None:
        modes = [m for m in (self.rate, self.concurrency, self.trace) if m is not None]
        if len(modes) != 1:
            raise ValueError("give exactly one of rate, concurrency or trace")
        if self.rate is not None and self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass
class LoadResult:
    records: list[RequestRecord] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    started: float = 0.0
    duration_s: float = 0.0
    failed: int = 0

    def summary(self) -> dict[str, Any]:
        return request_metrics(self.records, self.duration_s, None) | {"failed": self.failed}


class LoadGenerator:
    def __init__(self, config: LoadConfig, out: TextIO | None = None, quiet: bool = False) -> None:
        self.config = config
        self.rate = config.rate
        self.result = LoadResult()
        self.sent = 0
        self.completed = 0
        self.failed = 0
        self._quiet = quiet
        self.in_flight = 0
        self._rng = random.Random(config.seed)
        self._out = out
        self._stop = asyncio.Event()

    def set_rate(self, rate: float) -> None:
        """A new Poisson rate from now on (open loop only); 0 pauses."""
        if self.config.rate is None:
            raise ValueError("only an open-loop (rate) run changes its rate")
        self.rate = rate

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> LoadResult:
        config = self.config
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            base_url=config.url, headers=headers, timeout=config.timeout_s, limits=limits
        ) as http:
            model = config.model or await first_model(http)
            self.result.started = time.perf_counter()
            shown = asyncio.create_task(self._show())
            try:
                if config.concurrency is not None:
                    await asyncio.gather(
                        *(self._client(http, model) for _ in range(config.concurrency))
                    )
                else:
                    tasks = [
                        asyncio.create_task(self._one(http, model, request))
                        async for request in self._arrivals()
                    ]
                    await asyncio.gather(*tasks)
            finally:
                shown.cancel()
                self._draw(final=True)
        self.result.duration_s = time.perf_counter() - self.result.started
        self.result.failed = self.failed
        return self.result

    # -- arrivals --------------------------------------------------------------------------

    def _deadline_passed(self) -> bool:
        limit = self.config.duration_s
        elapsed = time.perf_counter() - self.result.started
        return self._stop.is_set() or (limit is not None and elapsed >= limit)

    def _draw_request(self) -> TraceRequest:
        config = self.config
        return TraceRequest(
            0.0, config.prompt_tokens.draw(self._rng), config.output_tokens.draw(self._rng)
        )

    async def _arrivals(self) -> AsyncIterator[TraceRequest]:
        """Yield each request at its arrival time (trace) or after a Poisson gap (rate)."""
        if self.config.trace is not None:
            for request in read_trace(self.config.trace):
                if not await self._sleep_until(self.result.started + request.arrived_at):
                    return
                yield request
            return
        while not self._deadline_passed():
            if not self.rate:
                await self._sleep_until(time.perf_counter() + PAUSED_POLL_S)
                continue
            yield self._draw_request()
            if not await self._sleep_until(time.perf_counter() + self._rng.expovariate(self.rate)):
                return

    async def _sleep_until(self, moment: float) -> bool:
        """Sleep until ``moment``; False when the run ended first."""
        while (left := moment - time.perf_counter()) > 0:
            if self._deadline_passed():
                return False
            try:
                await asyncio.wait_for(self._stop.wait(), min(left, 0.5))
                return False
            except TimeoutError:
                pass
        return not self._deadline_passed()

    async def _client(self, http: httpx.AsyncClient, model: str) -> None:
        while not self._deadline_passed():
            await self._one(http, model, self._draw_request())

    # -- one request -----------------------------------------------------------------------

    def _outgoing(self, model: str, request: TraceRequest) -> LoadRequest:
        chats = self.config.chat_prompts
        if chats is None:
            return token_request(model, request, self._rng)
        return chat_request(model, chats.draw(self._rng), chats.temperature)

    async def _one(self, http: httpx.AsyncClient, model: str, request: TraceRequest) -> None:
        outgoing = self._outgoing(model, request)
        prompt_tokens = outgoing.prompt_tokens
        index = self.sent
        self.sent += 1
        self.in_flight += 1
        metrics = RequestMetrics(arrival_time=time.perf_counter())
        try:
            async with http.stream("POST", outgoing.path, json=outgoing.body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    self._fail(f"{response.status_code}: {text[:200]}")
                    return
                async with contextlib.aclosing(events(response)) as stream:  # closed when cut
                    async for event in stream:
                        if "error" in event:
                            self._fail(json.dumps(event)[:200])
                            return
                        if carries_token(event):
                            now = time.perf_counter()
                            if metrics.first_token_time is None:
                                metrics.first_token_time = now
                            metrics.token_times.append(now)
                        elif prompt_tokens is None:
                            prompt_tokens = prompt_tokens_of(event)
            metrics.finish_time = time.perf_counter()
            self.completed += 1
            if self.config.keep_records:
                self.result.records.append(RequestRecord(index, "", prompt_tokens or 0, metrics))
        except (httpx.HTTPError, json.JSONDecodeError) as exc:  # this request's failure only
            self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1

    def _fail(self, message: str) -> None:
        self.failed += 1
        if len(self.result.failures) < MAX_FAILURES_KEPT:
            self.result.failures.append(message)

    # -- the live line ---------------------------------------------------------------------

    async def _show(self) -> None:
        while True:
            self._draw()
            await asyncio.sleep(0.5)

    def _draw(self, final: bool = False) -> None:
        out = self._out if self._out is not None else sys.stderr
        if self._quiet or not (final or out.isatty()):
            return
        elapsed = time.perf_counter() - self.result.started
        tokens = sum(r.output_tokens for r in self.result.records)
        rate = f" rate {self.rate:g}/s" if self.rate is not None else ""
        line = (
            f"[load] {elapsed:6.1f}s{rate} sent {self.sent} done {self.completed} "
            f"failed {self.failed} in flight {self.in_flight} · "
            f"{tokens / elapsed if elapsed > 0 else 0.0:.0f} output tok/s"
        )
        out.write(("\r\033[K" if out.isatty() else "") + line + ("\n" if final else ""))
        out.flush()


def run_load(config: LoadConfig, on_start: Callable[[LoadGenerator], None] | None = None):
    """Run a load to its end from synchronous code; returns the ``LoadResult``."""

    async def main() -> LoadResult:
        generator = LoadGenerator(config)
        if on_start is not None:
            on_start(generator)
        return await generator.run()

    return asyncio.run(main())
