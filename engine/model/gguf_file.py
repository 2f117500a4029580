"""A llama.cpp GGUF checkpoint: its metadata as a model config, its tensors as HF-named weights.

Read with ggml-org's ``gguf`` package (``GGUFReader``, a memory map): GGUF v2/v3, one file or
split files (``name-00001-of-00003.gguf``; any part names them all). Tensors are dequantized
one at a time (``gguf.quants.dequantize``, to float32) and cast to the engine's dtype as they
are copied in, so the load never holds more than the model plus one float32 tensor.

llama.cpp's converter permutes the rows of q and k for the Llama family (``llama``,
``mistral``) so that its rope pairs adjacent dimensions; ``_unpermute`` undoes it (the inverse
of ``convert_hf_to_gguf.py``'s ``LlamaModel.permute``, as transformers' ``LlamaTensorProcessor``
does), giving back the half-split layout the decoder's rope uses. Qwen2/Qwen3 are stored
unpermuted.

Everything is checked before a weight is read: the architecture, each tensor's type, and that
each tensor's bytes lie inside its file (a truncated file); ``CheckpointError`` names what is
wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

from engine.errors import CheckpointError
from engine.model.config import ModelConfig

Q = GGMLQuantizationType
SUPPORTED_TYPES = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}
    | {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
"""``general.architecture`` → the HF architecture whose family the decoder runs."""
PERMUTED = frozenset({"llama", "mistral"})
"""Architectures whose q/k rows llama.cpp's converter permutes."""
SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$")
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""``blk.N.<gguf>`` → ``model.layers.N.<hf>`` (the suffix ``.weight``/``.bias`` is kept)."""
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def split_files(path: str | Path) -> list[Path]:
    """Every part of the checkpoint ``path`` names (itself alone when it is not split), each
    checked to exist."""
    path = Path(path)
    match = SPLIT_NAME.match(path.name)
    if match is None:
        parts = [path]
    else:
        total = int(match["total"])
        names = [f"{match['stem']}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
        parts = [path.with_name(name) for name in names]
    for part in parts:
        if not part.is_file():
            raise CheckpointError(f"GGUF file {part} does not exist", part)
    return parts


def hf_tensor_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor; None for one the decoder has no place for."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)``: within each head, its rows were reordered from
    [first half, second half] to interleaved pairs; put them back."""
    dim = weights.shape[0] // heads // 2
    w = weights.reshape(heads, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def _value(field: Any) -> Any:
    """A metadata field as a Python value (a string, a number, a bool or a list of them)."""
    types = field.types
    if types[0] == GGUFValueType.ARRAY:
        items = [field.parts[i] for i in field.data]
        if types[-1] == GGUFValueType.STRING:
            return [bytes(item).decode("utf-8", errors="replace") for item in items]
        return [item.tolist()[0] for item in items]
    part = field.parts[field.data[0]]
    if types[0] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    if types[0] == GGUFValueType.BOOL:
        return bool(part[0])
    return part.tolist()[0]


class GGUFCheckpoint:
    """One GGUF checkpoint (all its parts), opened and checked; metadata is read lazily."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.parts = split_files(self.path)
        self.readers: list[GGUFReader] = []
        for part in self.parts:
            try:
                self.readers.append(GGUFReader(part))
            except (ValueError, IndexError, OSError, KeyError) as exc:
                raise CheckpointError(
                    f"{part.name} is not a readable GGUF file (truncated or corrupt): {exc}", part
                ) from exc
        self.fields = self.readers[0].fields
        self.arch = self.string("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise CheckpointError(
                f"GGUF architecture {self.arch!r} is not supported "
                f"(supported: {', '.join(ARCHITECTURES)})",
                self.path,
            )
        self._check_tensors()

    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else _value(field)

    def string(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise CheckpointError(f"{self.path.name} lacks the metadata key {key}", self.path)
        return value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise CheckpointError(f"{self.path.name} lacks the metadata key {key}", self.path)
        return value

    def tensor_names(self) -> set[str]:
        return {t.name for reader in self.readers for t in reader.tensors}

    def _check_tensors(self) -> None:
        for part, reader in zip(self.parts, self.readers, strict=True):
            size = part.stat().st_size
            for tensor in reader.tensors:
                if tensor.tensor_type not in SUPPORTED_TYPES:
                    kind = getattr(tensor.tensor_type, "name", str(tensor.tensor_type))
                    raise CheckpointError(
                        f"{part.name}: tensor {tensor.name} has type {kind}, not supported "
                        f"(supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))})",
                        part,
                    )
                if tensor.data_offset + tensor.n_bytes > size:
                    raise CheckpointError(
                        f"{part.name} is truncated: tensor {tensor.name} needs bytes up to "
                        f"{tensor.data_offset + tensor.n_bytes}, the file has {size}",
                        part,
                    )
                if tensor.name == "rope_freqs.weight":
                    raise CheckpointError(
                        f"{part.name}: rope_freqs.weight (per-frequency rope factors, Llama "
                        "3.1 style) is not supported",
                        part,
                    )

    def hf_config(self) -> dict[str, Any]:
        """The checkpoint's model config in ``config.json``'s terms (``ModelConfig.from_dict``
        reads it), built from ``{arch}.*`` metadata."""
        a = self.arch
        heads = self.require(f"{a}.attention.head_count")
        hidden = self.require(f"{a}.embedding_length")
        head_dim = self.get(f"{a}.attention.key_length") or hidden // heads
        rotary = self.get(f"{a}.rope.dimension_count")
        if rotary is not None and rotary != head_dim:
            raise CheckpointError(
                f"{a}.rope.dimension_count={rotary} (partial rotary) is not supported: "
                f"head_dim is {head_dim}",
                self.path,
            )
        value_dim = self.get(f"{a}.attention.value_length")
        if value_dim is not None and value_dim != head_dim:
            raise CheckpointError(
                f"{a}.attention.value_length={value_dim} differs from key_length={head_dim}",
                self.path,
            )
        names = self.tensor_names()
        vocab = self.get(f"{a}.vocab_size") or len(self.get("tokenizer.ggml.tokens") or ())
        if not vocab:
            vocab = self._tensor("token_embd.weight").shape[-1]
        eos = [self.get("tokenizer.ggml.eos_token_id")]
        eot = self.get("tokenizer.ggml.eot_token_id")
        if eot is not None and eot not in eos:
            eos.append(eot)
        return {
            "architectures": [ARCHITECTURES[a]],
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": self.require(f"{a}.feed_forward_length"),
            "num_hidden_layers": self.require(f"{a}.block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.get(f"{a}.attention.head_count_kv") or heads,
            "head_dim": head_dim,
            "max_position_embeddings": self.require(f"{a}.context_length"),
            "rms_norm_eps": self.require(f"{a}.attention.layer_norm_rms_epsilon"),
            "rope_theta": self.get(f"{a}.rope.freq_base", 10000.0),
            "rope_scaling": self._rope_scaling(),
            "tie_word_embeddings": "output.weight" not in names,
            "attention_bias": "blk.0.attn_q.bias" in names,
            "bos_token_id": self.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": [e for e in eos if e is not None],
        }

    def _rope_scaling(self) -> dict[str, Any] | None:
        kind = self.get(f"{self.arch}.rope.scaling.type")
        factor = self.get(f"{self.arch}.rope.scaling.factor")
        if kind in (None, "none") and factor in (None, 1.0):
            return None
        if kind == "linear" or (kind is None and factor is not None):
            return {"rope_type": "linear", "factor": float(factor)}
        raise CheckpointError(
            f"{self.arch}.rope.scaling.type={kind!r} is not supported (none, linear)", self.path
        )

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.hf_config(), self.path)

    def _tensor(self, name: str) -> Any:
        for reader in self.readers:
            for tensor in reader.tensors:
                if tensor.name == name:
                    return tensor
        raise CheckpointError(f"{self.path.name} has no tensor {name}", self.path)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named float32 tensors, dequantized one at a time; an unknown name is a
        ``CheckpointError`` naming it."""
        heads = self.require(f"{self.arch}.attention.head_count")
        kv_heads = self.get(f"{self.arch}.attention.head_count_kv") or heads
        for part, reader in zip(self.parts, self.readers, strict=True):
            for tensor in reader.tensors:
                name = hf_tensor_name(tensor.name)
                if name is None:
                    raise CheckpointError(f"unexpected tensor {tensor.name!r} in {part.name}", part)
                weights = dequantize(tensor.data, tensor.tensor_type)
                shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
                weights = weights.reshape(shape)
                if self.arch in PERMUTED and name.endswith(("q_proj.weight", "q_proj.bias")):
                    weights = _unpermute(weights, heads)
                elif self.arch in PERMUTED and name.endswith(("k_proj.weight", "k_proj.bias")):
                    weights = _unpermute(weights, kv_heads)
                weights = np.ascontiguousarray(weights, dtype=np.float32)
                if not weights.flags.writeable:  # F32 data is the read-only file map itself
                    weights = weights.copy()
                yield name, torch.from_numpy(weights)


@lru_cache(maxsize=2)
def open_checkpoint(path: Path) -> GGUFCheckpoint:
    """The checkpoint at ``path``, opened once per process (its metadata serves the config,
    the tokenizer and the chat template)."""
    return GGUFCheckpoint(path)
