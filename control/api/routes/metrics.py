"""``GET /metrics``: a plain route (a mounted ASGI app would answer 307 first)."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from control.api.deps import ContextDep
from serving.snapshot import EngineSnapshot

router = APIRouter(tags=["public"])


SNAPSHOT_WAIT_S = 1.0
"""How long a scrape waits for the engine's step boundary. A step that runs longer (a stall)
gets the last snapshot's figures, so the scrape still answers well inside Prometheus's
10 s timeout and the stall alerts (counters the watchdog keeps) can fire meanwhile."""


@router.get("/metrics", response_class=Response)
def metrics(ctx: ContextDep) -> Response:
    runtime = ctx.runtime

    def latest() -> EngineSnapshot | None:
        with contextlib.suppress(TimeoutError):  # the collector keeps the last snapshot
            return runtime.service.snapshot(timeout=SNAPSHOT_WAIT_S) if runtime else None
        return None

    return Response(ctx.metrics.render(latest), media_type=CONTENT_TYPE_LATEST)
