"""The subset of a Hugging Face ``config.json`` the decoder needs, and the checkpoint families.

Every family runs through the one decoder in ``engine/model/llama.py``; what a family changes
is a handful of switches here (``attention_bias``, ``o_proj_bias``, ``qk_norm``, ``head_dim``,
``tie_word_embeddings``), read from ``config.json``'s ``architectures``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Family:
    """What an architecture switches on in the decoder. ``None``: as ``config.json``'s
    ``attention_bias`` says (Llama and Qwen3 put it on q/k/v and o alike)."""

    qkv_bias: bool | None
    o_proj_bias: bool | None
    qk_norm: bool
    window_switch: str | None
    """The ``config.json`` key that turns ``sliding_window`` on; ``None``: a set window is on."""


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(None, None, qk_norm=False, window_switch="use_sliding_window"),
    "MistralForCausalLM": Family(False, False, qk_norm=False, window_switch=None),
    "Qwen2ForCausalLM": Family(True, False, qk_norm=False, window_switch="use_sliding_window"),
    "Qwen3ForCausalLM": Family(None, None, qk_norm=True, window_switch="use_sliding_window"),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


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
    """Capped at ``sliding_window`` when one is in effect (see ``from_dict``)."""
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    attention_bias: bool
    """q/k/v projections carry biases (Qwen2, or ``attention_bias`` in Llama/Qwen3)."""
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    architecture: str = "LlamaForCausalLM"
    o_proj_bias: bool = False
    qk_norm: bool = False
    """RMSNorm over each head of q and k before RoPE (Qwen3)."""
    sliding_window: int | None = None
    """The window when one is in effect; the context is then capped to it."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | Path = "config.json") -> ModelConfig:
        """Raises ``CheckpointError`` naming an unsupported architecture or setting.

        A sliding window in effect (Mistral's ``sliding_window``, Qwen's with
        ``use_sliding_window``) caps ``max_position_embeddings`` to the window: up to that
        length windowed attention equals full causal attention, so the decoder needs no window
        of its own and the engine never serves a sequence where they would differ.
        """
        architectures = raw.get("architectures") or ["LlamaForCausalLM"]
        family = FAMILIES.get(architectures[0])
        if family is None:
            raise CheckpointError(
                f"architecture {architectures[0]!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})",
                source,
            )
        _refuse_unsupported(raw, source)
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope_scaling = raw.get("rope_scaling")
        rope_theta = raw.get("rope_theta")
        if rope_theta is None and isinstance(raw.get("rope_parameters"), dict):
            rope_theta = raw["rope_parameters"].get("rope_theta")
            if raw["rope_parameters"].get("rope_type", "default") != "default":
                rope_scaling = raw["rope_parameters"]
        bias = bool(raw.get("attention_bias") or False)
        max_positions = raw.get("max_position_embeddings", 2048)
        window = _sliding_window(raw, family)
        if window is not None and window < max_positions:
            log.info(
                "%s: sliding_window=%d caps the context (max_position_embeddings=%d)",
                source,
                window,
                max_positions,
            )
            max_positions = window
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            max_position_embeddings=max_positions,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=bias if family.qkv_bias is None else family.qkv_bias,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            architecture=architectures[0],
            o_proj_bias=bias if family.o_proj_bias is None else family.o_proj_bias,
            qk_norm=family.qk_norm,
            sliding_window=window,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """A folder's ``config.json`` (any format: ``engine.model.formats.read_model_config``)."""
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise CheckpointError(f"no config.json in {path}", config_path)
        return cls.from_dict(json.loads(config_path.read_text()), config_path)


def _sliding_window(raw: dict[str, Any], family: Family) -> int | None:
    window = raw.get("sliding_window")
    if window is None:
        return None
    switched_on = family.window_switch is None or bool(raw.get(family.window_switch))
    return window if switched_on or "sliding_attention" in (raw.get("layer_types") or ()) else None


def _refuse_unsupported(raw: dict[str, Any], source: str | Path) -> None:
    """Settings the decoder does not implement, named rather than silently ignored."""
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"hidden_act={raw['hidden_act']!r} is not supported (silu)", source)
    if raw.get("mlp_bias"):
        raise CheckpointError("mlp_bias=true is not supported", source)
