"""Server settings: command-line flags over ``SERVEDECK_*`` environment variables over defaults.

``policy``, ``memory_reserve`` and ``reclaim_interval_s`` are *overrides*: unset, the newest
stored policy version decides; set, they win for this process until a PUT replaces them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from policies.base import PolicyName

MEMORY_RESERVE_BOUNDS = (0.0, 0.5)
RECLAIM_INTERVAL_BOUNDS = (0.5, 3600.0)
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVEDECK_", extra="ignore")

    model: Path | None = Field(None, description="Hugging Face model folder (default: embedded).")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    db: Path | None = Field(None, description="SQLite file (default: <cache>/servedeck.db).")
    admin_token: SecretStr | None = None
    admin_token_file: Path | None = Field(
        None, description="File holding the admin token (keeps it off the command line)."
    )
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
    api_key: SecretStr | None = Field(
        None, description="When set, /v1 routes require 'Authorization: Bearer <key>'."
    )
    api_key_file: Path | None = Field(None, description="File holding the API key.")
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, ge=1024, description="Larger request bodies get 413."
    )
    max_json_depth: int = Field(64, ge=2, description="Deeper JSON nesting gets 400.")
    max_stop_strings: int = Field(16, ge=1, description="Stop strings a request may give.")
    max_stop_length: int = Field(256, ge=1, description="Characters of one stop string.")
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    num_threads: int | None = Field(None, ge=1)
    maintenance_retention: int = Field(
        1000, ge=10, description="Maintenance runs kept in the database."
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="On SIGTERM, how long in-flight requests may take to finish."
    )
    stall_timeout_s: float = Field(
        30.0, gt=0, description="No progress for this long while busy: the engine is stalled."
    )
    policy_apply_timeout_s: float = Field(
        30.0, gt=0, description="How long a policy change waits for the engine (then pending)."
    )
    testing: bool = Field(False, description="Expose test-only routes (never in production).")
    log_level: str = "info"

    @model_validator(mode="after")
    def _read_api_key_file(self) -> Settings:
        """``--api-key-file`` fills ``api_key`` (so the key need not appear in ``ps``)."""
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            raise ValueError("the API key must not be empty")
        if self.api_key_file is None:
            return self
        if self.api_key is not None:
            raise ValueError("give --api-key or --api-key-file, not both")
        try:
            key = self.api_key_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the API key file: {exc.strerror}") from None
        if not key:
            raise ValueError(f"the API key file {self.api_key_file} is empty")
        self.api_key = SecretStr(key)
        return self

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
