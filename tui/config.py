"""Console settings: defaults here, overridden by ``SERVEDECK_TUI_*`` environment variables,
overridden in turn by command-line flags (``run_console`` arguments)."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVEDECK_TUI_", extra="ignore")

    url: str = "http://127.0.0.1:8000"
    token: str | None = None
    refresh: float = Field(1.0, description="Seconds between the end of a poll and the next.")
    min_refresh: float = Field(0.25, gt=0)
    max_refresh: float = Field(30.0, gt=0)
    read_only: bool = False
    actor: str | None = Field(None, description="Sent as X-Servedeck-Actor on changes.")
    timeout_s: float = Field(3.0, gt=0, description="Per-request timeout of a poll.")
    history_points: int = Field(120, ge=2, description="Samples kept for each sparkline.")
    ttft_warn_s: float = 0.5
    ttft_crit_s: float = 2.0
    tpot_warn_s: float = 0.1
    tpot_crit_s: float = 0.3
    e2e_warn_s: float = 10.0
    e2e_crit_s: float = 30.0
    keymap: dict[str, str] = Field(
        default_factory=dict, description="Command id → key, e.g. {'pause': 'space'}."
    )

    @model_validator(mode="after")
    def _refresh_within_limits(self) -> ConsoleSettings:
        if self.min_refresh > self.max_refresh:
            raise ValueError("min_refresh must not exceed max_refresh")
        self.refresh = min(max(self.refresh, self.min_refresh), self.max_refresh)
        return self
