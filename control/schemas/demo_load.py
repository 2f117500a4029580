"""``GET|PUT /admin/demo-load``."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
)


class DemoLoadView(BaseModel):
    """The demo load a server sends itself (``servedeck serve --demo-load R``)."""

    enabled: bool = Field(description="Whether the server was started with --demo-load.")
    rate: float = Field(0.0, description="Requests per second now (0: paused).")
    start_rate: float = Field(0.0, description="The rate it was started with (--demo-load).")
    sent: int = 0
    completed: int = 0
    failed: int = 0
    running: bool = Field(False, description="Whether its thread is alive.")


DEMO_LOAD_MAX_RATE = 100.0


class DemoLoadUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rate: StrictFloat = Field(
        ge=0, le=DEMO_LOAD_MAX_RATE, description="Requests per second; 0 pauses."
    )
