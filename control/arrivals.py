"""A bounded in-memory record of recent arrivals: what the what-if simulator replays.

Only times, lengths, tenant and priority are kept (never text or token ids): when a request
arrived on the engine's clock, how many prompt tokens it had and how many it generated, whose
it was and its priority. The record is fed by
the ``AsyncEngine``'s ``on_finished`` hook (so a request enters once its output length is
known) and exported as the simulator's trace (``sim.trace``'s CSV) by ``GET /admin/trace.csv``.
Requests that were aborted or failed are left out: their output length is not what the
client asked for, so replaying it would predict a different load.

Each entry also keeps when the request got its first token and finished, and its TTFT and
TPOT: ``finished(since, until)`` is what the guardrail measures the engine by (its observed
figures over a window), from the same record the simulator replays.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from engine.outputs import RequestOutput
from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT
from sim.trace import TraceRequest

DEFAULT_CAPACITY = 10_000
"""Arrivals kept; the oldest are dropped first."""
SKIPPED_REASONS = frozenset({"abort", "error"})


@dataclass(frozen=True, slots=True)
class Finished:
    """A finished request as the guardrail measures it (times on the engine's clock)."""

    finish_time: float
    ttft: float
    tpot: float | None
    """Mean time per output token after the first; None for a one-token request."""
    output_tokens: int
    priority: int = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Arrival:
    arrival_time: float
    """On the engine's clock (monotonic seconds), like every time here."""
    prompt_tokens: int
    generated_tokens: int
    first_token_time: float | None = None
    finish_time: float | None = None
    ttft: float | None = None
    tpot: float | None = None
    tenant: str = DEFAULT_TENANT
    priority: int = DEFAULT_PRIORITY


class ArrivalLog:
    """Thread-safe ring of the last ``capacity`` finished requests' arrivals."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._arrivals: deque[Arrival] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._arrivals.maxlen or 0

    def __len__(self) -> int:
        return len(self._arrivals)

    def record(self, output: RequestOutput) -> None:
        """The ``on_finished`` hook: keep a finished request's arrival and lengths."""
        if output.finish_reason in SKIPPED_REASONS or not output.token_ids:
            return
        metrics = output.metrics
        arrival = Arrival(
            metrics.arrival_time,
            len(output.prompt_token_ids),
            len(output.token_ids),
            metrics.first_token_time,
            metrics.finish_time,
            metrics.ttft,
            metrics.tpot,
            output.tenant,
            output.priority,
        )
        with self._lock:
            self._arrivals.append(arrival)

    def trace(
        self, limit: int | None = None, finished_since: float | None = None
    ) -> list[TraceRequest]:
        """The most recent ``limit`` arrivals (all when None; with ``finished_since``, only
        requests that finished after it, engine clock) as a trace: ordered by arrival,
        ``arrived_at`` in seconds after the first of them."""
        with self._lock:
            arrivals = list(self._arrivals)
        if finished_since is not None:
            arrivals = [
                a for a in arrivals if a.finish_time is not None and a.finish_time > finished_since
            ]
        arrivals.sort(key=lambda a: a.arrival_time)
        if limit is not None:
            arrivals = arrivals[-limit:] if limit > 0 else []
        if not arrivals:
            return []
        start = arrivals[0].arrival_time
        return [
            TraceRequest(
                arrived_at=a.arrival_time - start,
                num_prefill_tokens=a.prompt_tokens,
                num_decode_tokens=a.generated_tokens,
                tenant=a.tenant,
                priority=a.priority,
            )
            for a in arrivals
        ]

    def finished(self, since: float, until: float) -> list[Finished]:
        """The requests that finished in ``(since, until]`` (engine clock), in the order
        they were recorded."""
        with self._lock:
            arrivals = list(self._arrivals)
        return [
            Finished(a.finish_time, a.ttft, a.tpot, a.generated_tokens, a.priority)
            for a in arrivals
            if a.finish_time is not None and a.ttft is not None and since < a.finish_time <= until
        ]
