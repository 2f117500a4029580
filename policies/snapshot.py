"""What a policy reports of itself for ``/admin/state`` (``SchedulingPolicy.snapshot``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PolicySnapshot(BaseModel):
    """What a policy reports of itself for ``/admin/state``; policies add their own fields
    in a subclass. Built fresh by each ``snapshot()`` call, never edited afterwards."""

    model_config = ConfigDict(frozen=True, from_attributes=True)
    policy: str = Field(description="The policy's name.")
    params: dict[str, Any] = Field(
        description="Its params in force: defaults filled in, engine caps shown as values."
    )
    waiting: int = Field(description="Requests waiting to be admitted.")
    running: int = Field(description="Requests holding KV blocks and being computed.")
    preemptions: int = Field(description="Sequences preempted (recompute) so far.")
    overdue: int = Field(0, description="Waiting requests past max_wait_s (aging).")
    mode: str | None = Field(None, description="The hybrid policy's current mode.")
    draining_to: int | None = Field(
        None,
        description=(
            "Draining to N: the cap on running sequences in force while more than it are "
            "running (a lowered cap admits nobody until under it and preempts nobody); "
            "null otherwise."
        ),
    )
