"""Server settings: command-line flags over ``SERVEDECK_*`` environment variables over defaults.

``policy``, ``memory_reserve`` and ``reclaim_interval_s`` are *overrides*: unset, the newest
stored policy version decides; set, they win for this process until a PUT replaces them.

The engine settings are EngineConfig's fields: ``ENGINE_SETTINGS`` names the ones the server
takes, ``POLICY_OVERRIDES`` the ones the policy store decides (None by default here). Their
types are written out in ``EngineSettings`` for the type checker; default, bounds and help
come from EngineConfig (``engine_field``), and tests/control/test_config_knobs.py checks that
the types, defaults, bounds and help all match EngineConfig's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from control.chat.tools import ToolFormat
from control.core.api_keys import ApiKeys
from engine.config import MEMORY_RESERVE_BOUNDS, DtypeSetting, config_options
from policies.base import PolicyName

__all__ = ["MEMORY_RESERVE_BOUNDS", "RECLAIM_INTERVAL_BOUNDS", "Settings"]

RECLAIM_INTERVAL_BOUNDS = (0.5, 3600.0)
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_SCHEDULES = 100
"""Live schedules at most (``max_schedules``): the schedule job reads them all every second."""
POLICY_OVERRIDES = ("policy", "memory_reserve")
"""EngineConfig fields the stored policy version decides; a setting overrides it."""
ENGINE_SETTINGS = (
    "device",
    "dtype",
    "block_size",
    "num_kv_blocks",
    "max_model_len",
    "max_waiting",
    "timelines_kept",
    "wait_window_s",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_threads",
    "native_attention",
    "packed_products",
    "tensor_parallel_size",
    "tokenizer",
)
"""EngineConfig fields the server takes as settings, with EngineConfig's defaults."""


def engine_type(name: str) -> Any:  # Any: a type built at run time (a typing form)
    """The type EngineConfig gives field ``name`` as a setting (a policy override's and an
    optional field's with None; ``choices`` as a ``Literal``)."""
    option = config_options()[name]
    kind: Any = Literal[option.choices] if option.choices else option.type
    if name == "policy":
        kind = PolicyName
    if name in POLICY_OVERRIDES or option.optional:
        kind = kind | None
    return kind


def engine_field(name: str) -> Any:  # Any: a FieldInfo stands for the default, as with Field
    """EngineConfig's field ``name`` as a setting's default: its default (None for a policy
    override), bounds and help."""
    option = config_options()[name]
    default = None if name in POLICY_OVERRIDES else option.default
    return Field(default, description=option.help, ge=option.ge, le=option.le)


class EngineSettings(BaseSettings):
    """The EngineConfig fields the server takes (``POLICY_OVERRIDES`` + ``ENGINE_SETTINGS``),
    typed as EngineConfig types them (a test compares each with ``engine_type``)."""

    policy: PolicyName | None = engine_field("policy")
    memory_reserve: float | None = engine_field("memory_reserve")
    device: str = engine_field("device")
    dtype: DtypeSetting = engine_field("dtype")
    block_size: Literal[16, 32, 64] = engine_field("block_size")  # engine.config.BLOCK_SIZES
    num_kv_blocks: int | None = engine_field("num_kv_blocks")
    max_model_len: int | None = engine_field("max_model_len")
    max_waiting: int = engine_field("max_waiting")
    timelines_kept: int = engine_field("timelines_kept")
    wait_window_s: float = engine_field("wait_window_s")
    max_num_seqs: int = engine_field("max_num_seqs")
    max_num_batched_tokens: int = engine_field("max_num_batched_tokens")
    num_threads: int | None = engine_field("num_threads")
    native_attention: bool = engine_field("native_attention")
    packed_products: Literal["auto", "onednn", "off"] = engine_field("packed_products")
    tensor_parallel_size: int = engine_field("tensor_parallel_size")
    tokenizer: str | None = engine_field("tokenizer")


DEMO_LOAD_RATE = 0.5
"""Requests/s of ``--demo-load`` given without a rate (gentle: batching shows, the CPU keeps
up). The real default model's chat answers average ~100 tokens, and its continuous batching
serves ~100 output tokens/s on 2 cores: 2 requests/s queued without end, 0.5 keeps up."""


class Settings(EngineSettings):
    model_config = SettingsConfigDict(env_prefix="SERVEDECK_", extra="ignore")

    model: Path | None = Field(None, description="Model folder or GGUF file (default: embedded).")
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    db: Path | None = Field(None, description="SQLite file (default: <cache>/servedeck.db).")
    admin_token: SecretStr | None = None
    admin_token_file: Path | None = Field(
        None, description="File holding the admin token (keeps it off the command line)."
    )
    reclaim_interval_s: float | None = Field(
        None, ge=RECLAIM_INTERVAL_BOUNDS[0], le=RECLAIM_INTERVAL_BOUNDS[1]
    )
    api_key: SecretStr | None = Field(
        None, description="When set, /v1 routes require 'Authorization: Bearer <key>'."
    )
    api_key_file: Path | None = Field(
        None,
        description="File holding the API keys: one per line, 'name:key' for a key that "
        "names its tenant, or a bare key (docs/api.md).",
    )
    _api_keys: ApiKeys | None = PrivateAttr(None)
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, ge=1024, description="Larger request bodies get 413."
    )
    max_json_depth: int = Field(64, ge=2, description="Deeper JSON nesting gets 400.")
    max_stop_strings: int = Field(16, ge=1, description="Stop strings a request may give.")
    max_stop_length: int = Field(256, ge=1, description="Characters of one stop string.")
    max_schedules: int = Field(
        DEFAULT_MAX_SCHEDULES, ge=1, description="Live schedules at most (more: 422)."
    )
    max_batch_prompts: int = Field(
        256,
        ge=1,
        description="Prompts one /v1/completions request may batch (each is a request of its "
        "own, admitted with the others or refused with them); more get 400.",
    )
    max_request_tokens: int = Field(
        32_768,
        ge=1,
        description="Tokens one request may hold, n × (prompt + max_tokens) summed over its "
        "prompts, never below max_model_len; past it 400 naming max_tokens.",
    )
    max_logprob_entries: int = Field(
        100_000,
        ge=1,
        description="Logprob entries one answer may carry, n × (echoed prompt + max_tokens) × "
        "(logprobs + 1) summed over its prompts; past it 400 naming logprobs.",
    )
    chat_template_timeout_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="A chat template's render is stopped after this long (400 "
        "chat_template_error); a conversation waits as long at most for a free render worker.",
    )
    max_chat_template_output: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Characters a chat template may render; past them it is stopped (400).",
    )
    chat_template_workers: int = Field(
        2, ge=1, le=64, description="Worker processes that render chat templates."
    )
    tool_call_parser: ToolFormat | None = Field(
        None,
        description="How the model writes tool calls: hermes (<tool_call> JSON) or "
        "llama3_json; unset, the chat template's own (docs/api.md).",
    )
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
    cost_model: str | None = Field(
        None,
        description="Cost model dry runs predict with: a profile (gpu/model, e.g. "
        "a100-80g/llama3-8b) or a calibration file (servedeck calibrate); none: no prediction.",
    )
    # The console waits 3 s for a dry run (tui.client's timeout), so a prediction's default
    # limit stays under it; 1000 short requests under two settings take ~1.7 s here.
    prediction_timeout_s: float = Field(
        2.0, gt=0, description="A dry run's prediction stops after this long (timed out)."
    )
    prediction_max_requests: int = Field(
        1000, ge=1, description="A prediction replays at most this many recent requests."
    )
    demo_load: float | None = Field(
        None,
        ge=0,
        le=100,
        description="Requests/s of a demo load the server sends itself (off unless given; "
        "make run passes it).",
    )
    replicas: int | None = Field(
        None,
        ge=1,
        description="Engine replicas on Ray Serve behind this control plane (needs the "
        "distributed extra); unset: one engine in this process.",
    )
    ray_address: str | None = Field(
        None, description="Ray instance to join with --replicas (default: start one on loopback)."
    )
    ray_app_name: str = Field("servedeck", description="The Ray Serve application's name.")
    min_replicas: int | None = Field(None, ge=1, description="Autoscaling floor (with max).")
    max_replicas: int | None = Field(
        None, ge=1, description="Autoscaling ceiling: set, Ray Serve scales by ongoing requests."
    )
    target_ongoing_requests: float = Field(
        8.0, gt=0, description="Autoscaling: requests in flight per replica Ray Serve aims at."
    )
    fleet_drain_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="A restart (servedeck fleet restart) lets a replica's requests finish this "
        "long before it ends the rest with an error.",
    )
    prefix_probe_timeout_s: float = Field(
        0.5,
        ge=0,
        le=10,
        description="How long routing waits for each replica to say how much of a prompt its "
        "prefix cache holds; the router's memory of where it sent each prefix stands in for a "
        "late answer (0: no probe, the memory alone, no added latency).",
    )
    expose_text: bool = Field(
        False,
        description="Keep the prompt and output text of the running and the last few finished "
        "requests in memory for GET /admin/requests/{id} (the console's detail view); off: "
        "no text is kept at all (make run passes it).",
    )
    testing: bool = Field(False, description="Expose test-only routes (never in production).")
    log_level: str = "info"
    cors_allow_origins: str | None = Field(
        None,
        description="Comma-separated origins browsers may call the API from (CORS); off unset.",
    )

    def local_url(self) -> str:
        """Where a client on this machine reaches the server (a wildcard host is loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def cors_origins(self) -> list[str]:
        return [o.strip() for o in (self.cors_allow_origins or "").split(",") if o.strip()]

    @model_validator(mode="after")
    def _read_api_key_file(self) -> Settings:
        """``--api-key-file`` fills the keys (so no key need appear in ``ps``), ``api_key``
        with its first (the server's own clients use it)."""
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            raise ValueError("the API key must not be empty")
        if self.api_key_file is None:
            self._api_keys = ApiKeys.single(self.api_key) if self.api_key is not None else None
            return self
        if self.api_key is not None:
            raise ValueError("give --api-key or --api-key-file, not both")
        try:
            text = self.api_key_file.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the API key file: {exc.strerror}") from None
        self._api_keys = ApiKeys.parse(text, str(self.api_key_file))
        self.api_key = self._api_keys.first
        return self

    def api_keys(self) -> ApiKeys | None:
        """The keys /v1 accepts (None: no key needed)."""
        return self._api_keys

    def engine_values(self) -> dict[str, Any]:  # Any: EngineConfig's keyword arguments
        """The engine settings by EngineConfig field name (the overrides go through the
        policy store, see ``control.policy.rows.with_overrides``)."""
        return {name: getattr(self, name) for name in ENGINE_SETTINGS}

    def db_path(self) -> Path:
        if self.db is not None:
            return self.db
        from engine.checkpoint import cache_dir

        return cache_dir() / "servedeck.db"

    def tokenizer_dir(self) -> Path | None:
        """``--tokenizer``: the folder whose tokenizer and chat template win over the model's."""
        return Path(self.tokenizer) if self.tokenizer else None

    def policy_overrides(self) -> dict[str, object]:
        """The settings that override the stored version (by its field's dotted name), for this
        process until a PUT replaces them."""
        overrides: dict[str, object] = {}
        if self.policy is not None:
            overrides["policy.name"] = self.policy
        if self.memory_reserve is not None:
            overrides["memory_reserve"] = self.memory_reserve
        if self.reclaim_interval_s is not None:
            overrides["reclaim_interval_s"] = self.reclaim_interval_s
        return overrides

    def model_dir(self) -> Path:
        if self.model is not None:
            return self.model
        from engine.shipped_models import embedded_default

        return embedded_default()
