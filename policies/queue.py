"""The setting's second axis: in which order the waiting queue is served, beside the batching
policy. A discriminated union on ``name``; ``fcfs`` (first come, first served: today's
behaviour, which every policy has) is its only member until the priority/fair-share issue adds
its own. The engine does not read it yet."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FcfsQueue(BaseModel):
    """First come, first served (the policy's own order, aging included); no params."""

    # ``name`` is the union's tag: JSON must carry it (``{}`` is no queue), so the schema says
    # required; the default is for building one in Python (``FcfsQueue()``).
    model_config = ConfigDict(
        extra="forbid", frozen=True, json_schema_extra=lambda schema: _tag_required(schema)
    )
    name: Literal["fcfs"] = Field("fcfs", description="Queue order.")


def _tag_required(schema: dict[str, Any]) -> None:
    schema["required"] = ["name"]


QueueSpec = Annotated[FcfsQueue, Field(discriminator="name")]
"""Every queue order by ``name`` (a second member joins as ``FcfsQueue | ...``)."""
