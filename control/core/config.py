"""Server settings: command-line flags over ``SERVEDECK_*`` environment variables over defaults.

``policy``, ``memory_reserve`` and ``reclaim_interval_s`` are *overrides*: unset, the newest
stored policy version decides; set, they win for this process until a PUT replaces them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from policies.base import PolicyName

MEMORY_RESERVE_BOUNDS = (0.0, 0.5)
RECLAIM_INTERVAL_BOUNDS = (0.5, 3600.0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVEDECK_", extra="ignore")

    model: Path | None = Field(None, description="Hugging Face model folder (default: embedded).")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    db: Path | None = Field(None, description="SQLite file (default: <cache>/servedeck.db).")
    admin_token: SecretStr | None = None
    policy: PolicyName | None = None
    memory_reserve: float | None = Field(
        None, ge=MEMORY_RESERVE_BOUNDS[0], le=MEMORY_RESERVE_BOUNDS[1]
    )
    reclaim_interval_s: float | None = Field(
        None, ge=RECLAIM_INTERVAL_BOUNDS[0], le=RECLAIM_INTERVAL_BOUNDS[1]
    )
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    block_size: Literal[16, 32, 64] = 16
    num_kv_blocks: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=2)
    max_waiting: int = Field(1024, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    num_threads: int | None = Field(None, ge=1)
    maintenance_retention: int = Field(
        1000, ge=10, description="Maintenance runs kept in the database."
    )
    testing: bool = Field(False, description="Expose test-only routes (never in production).")
    log_level: str = "info"

    def db_path(self) -> Path:
        if self.db is not None:
            return self.db
        from engine.checkpoint import cache_dir

        return cache_dir() / "servedeck.db"

    def model_dir(self) -> Path:
        if self.model is not None:
            return self.model
        from engine.checkpoint import default_model_dir

        return default_model_dir()
