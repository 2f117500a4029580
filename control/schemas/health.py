"""``GET /health`` and ``GET /ready``."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    policy: str
    version: int
    reclaim_job_on_time: bool


class HealthLoading(BaseModel):
    status: Literal["loading", "failed"] = "loading"


NotReadyReason = Literal["loading", "failed", "draining", "stalled"]


class Ready(BaseModel):
    status: Literal["ready"] = "ready"


class NotReady(BaseModel):
    """``GET /ready`` while the server should get no new traffic."""

    status: Literal["not_ready"] = "not_ready"
    reason: NotReadyReason
    detail: str = Field(description="What the reason means right now, for a person.")
