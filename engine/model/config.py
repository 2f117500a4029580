"""The subset of a Hugging Face ``config.json`` the decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    attention_bias: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        architectures = raw.get("architectures") or ["LlamaForCausalLM"]
        if architectures[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {architectures[0]!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope_scaling = raw.get("rope_scaling")
        rope_theta = raw.get("rope_theta")
        if rope_theta is None and isinstance(raw.get("rope_parameters"), dict):
            rope_theta = raw["rope_parameters"].get("rope_theta")
            if raw["rope_parameters"].get("rope_type", "default") != "default":
                rope_scaling = raw["rope_parameters"]
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", False),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        return cls.from_dict(json.loads(config_path.read_text()))
