"""Load a Hugging Face checkpoint folder (single file or sharded index) into the fused decoder.

A folder holds ``config.json``, ``tokenizer.json`` and ``model.safetensors`` or
``model.safetensors.index.json`` with the shards it names; a missing one is a
``CheckpointError`` naming it, before any weight is read. Weights are read tensor by tensor
into the parameters (``engine.model.safetensors_file``), never as a whole second copy.

A tensor-parallel rank (``shard``) loads its slice of each split tensor (``split_dim``):
the whole tensor is read, then its slice copied, one tensor at a time.

A path ending in ``.gguf`` is a llama.cpp GGUF checkpoint (``engine.model.gguf_file``): its
config comes from the file's metadata and its tensors, named as Hugging Face names them, are
dequantized into the parameters a slab of rows at a time, through the same targets.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, TypeVar

import torch

from engine.errors import CheckpointError
from engine.model.config import ModelConfig
from engine.model.formats import checkpoint_files, is_gguf, read_model_config
from engine.model.gguf_file import open_checkpoint
from engine.model.llama import LlamaForCausalLM
from engine.model.safetensors_file import SafetensorsFile
from engine.parallel.shard import SINGLE, Shard

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
SPLIT_DIMS = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0}
"""Column-parallel projections: a rank takes its rows (weight and bias)."""
ROW_PARALLEL = ("o_proj", "down_proj")
"""Row-parallel projections: a rank takes its columns of the weight; the bias stays whole."""


def load_model(
    path: str | Path, dtype: torch.dtype, device: torch.device, shard: Shard = SINGLE
) -> LlamaForCausalLM:
    files = checkpoint_files(path)
    if is_gguf(path):
        ckpt = open_checkpoint(Path(path))
        model = LlamaForCausalLM(ckpt.model_config(), dtype, device, shard)
        targets = WeightTargets(model)
        _read_entries(targets, ckpt, ckpt.entries(), Path(path))
    else:
        model = LlamaForCausalLM(read_model_config(path), dtype, device, shard)
        targets = WeightTargets(model)
        for file in files.weights:
            with SafetensorsFile(file) as weights:
                _read_entries(targets, weights, weights.entries, file)
    targets.check_complete(Path(path))
    return model.eval()


class Entry(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Entry)
E_contra = TypeVar("E_contra", contravariant=True)


class TensorReader(Protocol[E_contra]):
    """A checkpoint read tensor by tensor (``SafetensorsFile``, ``GGUFCheckpoint``): into the
    parameter itself, or whole, for a rank that keeps a slice."""

    def read_into(self, entry: E_contra, dst: torch.Tensor) -> None: ...

    def read(self, entry: E_contra) -> torch.Tensor: ...


def _read_entries(
    targets: WeightTargets, reader: TensorReader[E], entries: Iterable[E], where: Path
) -> None:
    shard = targets.model.shard
    for entry in entries:
        dst = targets.destination(entry.name, where)
        if dst is None:
            continue
        dim = split_dim(entry.name) if shard.parallel else None
        if dim is None:
            reader.read_into(entry, dst)
        else:
            _copy(entry.name, dst, shard.narrow(reader.read(entry), dim), where)


def build_model(
    config: ModelConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard = SINGLE,
) -> LlamaForCausalLM:
    """The decoder for ``config`` with its weights copied in from HF-named ``tensors`` made in
    memory (``engine.checkpoint_parts.RandomWeights``); files go through ``load_model``."""
    model = LlamaForCausalLM(config, dtype, device, shard)
    load_weights(model, tensors)
    return model.eval()


def load_weights(
    model: LlamaForCausalLM,
    tensors: Iterable[tuple[str, torch.Tensor]],
    where: str | Path = "tensors",
) -> None:
    """Copy HF-named tensors into the model, fusing q/k/v and gate/up as they arrive;
    ``where`` (the file they come from) names the source in errors."""
    targets = WeightTargets(model)
    shard = model.shard
    for name, tensor in tensors:
        dst = targets.destination(name, where)
        if dst is None:
            continue
        dim = split_dim(name) if shard.parallel else None
        _copy(name, dst, tensor if dim is None else shard.narrow(tensor, dim), where)
    targets.check_complete(Path(where))


def split_dim(name: str) -> int | None:
    """The dimension a tensor-parallel rank slices ``name`` along; None: whole on every rank."""
    parts = name.split(".")
    if len(parts) < 6 or parts[3] not in ("self_attn", "mlp"):
        return None
    proj, kind = parts[4], parts[-1]
    if proj in SPLIT_DIMS:
        return SPLIT_DIMS[proj]
    return 1 if proj in ROW_PARALLEL and kind == "weight" else None


def _copy(name: str, dst: torch.Tensor, tensor: torch.Tensor, where: str | Path) -> None:
    if dst.shape != tensor.shape:
        raise CheckpointError(
            f"{name}: expected shape {tuple(dst.shape)}, got {tuple(tensor.shape)}", where
        )
    with torch.no_grad():
        dst.copy_(tensor)


class WeightTargets:
    """Where each Hugging Face tensor name lands in the fused decoder: a parameter, or a row
    range of the fused q/k/v and gate/up matrices; records what arrived."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        config, shard = model.config, model.shard
        q_size = shard.part(config.num_attention_heads) * config.head_dim
        kv_size = shard.part(config.num_key_value_heads) * config.head_dim
        self.qkv_rows = {"q_proj": (0, q_size), "k_proj": (q_size, kv_size)}
        self.qkv_rows["v_proj"] = (q_size + kv_size, kv_size)
        inter = shard.part(config.intermediate_size)
        self.mlp_rows = {"gate_proj": (0, inter), "up_proj": (inter, inter)}
        self.seen: set[str] = set()

    def destination(self, name: str, where: str | Path) -> torch.Tensor | None:
        """The tensor ``name`` is copied into; None for one that is not needed."""
        if name == "lm_head.weight" and self.model.lm_head is None:
            return None  # tied embeddings, stored anyway by some exporters
        if name.endswith(IGNORED_SUFFIXES):
            return None
        target = self._lookup(name)
        if target is None:
            raise CheckpointError(f"unexpected tensor {name!r} in {Path(where).name}", where)
        self.seen.add(name)
        return target

    def _lookup(self, name: str) -> torch.Tensor | None:
        model = self.model
        if name == "model.embed_tokens.weight":
            return model.embed_tokens
        if name == "model.norm.weight":
            return model.norm.weight
        if name == "lm_head.weight":
            return model.lm_head
        parts = name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
            return None
        if int(parts[2]) >= len(model.layers):
            return None
        layer = model.layer(int(parts[2]))
        module, proj, kind = parts[3], parts[4], parts[-1]
        if module == "input_layernorm" and kind == "weight":
            return layer.input_layernorm.weight
        if module == "post_attention_layernorm" and kind == "weight":
            return layer.post_attention_layernorm.weight
        attn, mlp = layer.self_attn, layer.mlp
        if module == "self_attn" and proj in self.qkv_rows:
            fused = attn.qkv_proj if kind == "weight" else attn.qkv_bias
            start, rows = self.qkv_rows[proj]
            return None if fused is None else fused[start : start + rows]
        if module == "self_attn" and proj == "o_proj":
            return attn.o_proj if kind == "weight" else attn.o_bias
        if module == "self_attn" and proj in ("q_norm", "k_norm"):
            norm = attn.q_norm if proj == "q_norm" else attn.k_norm
            return None if norm is None else norm.weight
        if module == "mlp" and proj in self.mlp_rows and kind == "weight":
            start, rows = self.mlp_rows[proj]
            return mlp.gate_up_proj[start : start + rows]
        if module == "mlp" and proj == "down_proj" and kind == "weight":
            return mlp.down_proj
        return None

    def check_complete(self, where: Path) -> None:
        missing = sorted(expected_names(self.model) - self.seen)
        if missing:
            raise CheckpointError(
                f"{where} lacks {len(missing)} tensors, e.g. {', '.join(missing[:3])}", where
            )


def expected_names(model: LlamaForCausalLM) -> set[str]:
    config = model.config
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if model.lm_head is not None:
        names.add("lm_head.weight")
    for i in range(config.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        names |= {
            f"model.layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")
        }
        names |= {f"{attn}.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        names |= {f"{mlp}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        if config.attention_bias:
            names |= {f"{attn}.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")}
        if config.o_proj_bias:
            names.add(f"{attn}.o_proj.bias")
        if config.qk_norm:
            names |= {f"{attn}.q_norm.weight", f"{attn}.k_norm.weight"}
    return names
