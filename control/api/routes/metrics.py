"""``GET /metrics``: a plain route (a mounted ASGI app would answer 307 first)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from control.api.deps import ContextDep

router = APIRouter(tags=["public"])


@router.get("/metrics", response_class=Response)
def metrics(ctx: ContextDep) -> Response:
    snapshot = ctx.runtime.llm_engine.snapshot() if ctx.runtime is not None else None
    return Response(ctx.metrics.render(snapshot), media_type=CONTENT_TYPE_LATEST)
