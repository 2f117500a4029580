"""Load Hugging Face Llama weights (single file or sharded index) into the fused decoder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def checkpoint_files(path: Path) -> list[Path]:
    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")


def iter_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, handle.get_tensor(name)


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    path = Path(path)
    return build_model(ModelConfig.from_dir(path), iter_tensors(path), dtype, device)


def build_model(
    config: ModelConfig,
    tensors: Iterator[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device,
) -> LlamaForCausalLM:
    """The decoder for ``config`` with its weights copied in from HF-named ``tensors`` (read
    from files by ``load_model``, or made in memory: ``engine.builder.RandomWeights``)."""
    model = LlamaForCausalLM(config, dtype, device)
    load_weights(model, tensors)
    return model.eval()


def load_weights(model: LlamaForCausalLM, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into the model, fusing q/k/v and gate/up as they arrive."""
    config = model.config
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    fused_rows = {
        "q_proj": (0, q_size),
        "k_proj": (q_size, kv_size),
        "v_proj": (q_size + kv_size, kv_size),
    }
    mlp_rows = {"gate_proj": 0, "up_proj": config.intermediate_size}
    seen: set[str] = set()
    for name, tensor in tensors:
        if name == "lm_head.weight" and model.lm_head is None:
            continue
        target, rows = _target(model, name, fused_rows, mlp_rows, config.intermediate_size)
        if target is None:
            if "rotary_emb" in name:
                continue
            raise ValueError(f"unexpected tensor {name!r} in checkpoint")
        with torch.no_grad():
            view = target if rows is None else target[rows[0] : rows[0] + rows[1]]
            if view.shape != tensor.shape:
                raise ValueError(
                    f"{name}: expected shape {tuple(view.shape)}, got {tuple(tensor.shape)}"
                )
            view.copy_(tensor.to(view.dtype))
        seen.add(name)
    expected = _expected_names(model)
    missing = sorted(expected - seen)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _target(model, name, fused_rows, mlp_rows, intermediate):
    if name == "model.embed_tokens.weight":
        return model.embed_tokens, None
    if name == "model.norm.weight":
        return model.norm.weight, None
    if name == "lm_head.weight":
        return model.lm_head, None
    parts = name.split(".")
    if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
        return None, None
    layer = model.layers[int(parts[2])]
    module, proj, kind = parts[3], parts[4], parts[-1]
    if module in ("input_layernorm", "post_attention_layernorm"):
        return getattr(layer, module).weight, None
    if module == "self_attn" and proj in fused_rows:
        target = layer.self_attn.qkv_proj if kind == "weight" else layer.self_attn.qkv_bias
        return target, fused_rows[proj]
    if module == "self_attn" and proj == "o_proj":
        return layer.self_attn.o_proj, None
    if module == "mlp" and proj in mlp_rows:
        return layer.mlp.gate_up_proj, (mlp_rows[proj], intermediate)
    if module == "mlp" and proj == "down_proj":
        return layer.mlp.down_proj, None
    return None, None


def _expected_names(model: LlamaForCausalLM) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if model.lm_head is not None:
        names.add("lm_head.weight")
    for i in range(model.config.num_hidden_layers):
        prefix = f"model.layers.{i}"
        names |= {f"{prefix}.input_layernorm.weight", f"{prefix}.post_attention_layernorm.weight"}
        names |= {
            f"{prefix}.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
        }
        names |= {f"{prefix}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        if model.config.attention_bias:
            names |= {f"{prefix}.self_attn.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")}
    return names
