"""A llama.cpp GGUF checkpoint: its metadata as a model config, its tensors as HF-named weights.

GGUF v2/v3, one file or split files (``name-00001-of-00003.gguf``; any part names them all).
The header is parsed into plain values (``engine.model.gguf_header``); each tensor is read into
its parameter a slab of rows at a time (``engine.model.gguf_tensors``: ``readinto``, then
ggml-org's ``gguf.quants.dequantize`` to float32, cast to the engine's dtype as it is copied
in), so a load holds the model and one slab, with nothing of the file mapped (measured on the
shipped SmolLM2 file: ``docs/gguf.md``).

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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import CheckpointError
from engine.model.config import ModelConfig
from engine.model.gguf_header import TensorInfo, read_header
from engine.model.gguf_tensors import fill_tensor, read_tensor

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


def _unpermute(weights: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute(w, n_head)``: within each head, its rows were reordered from
    [first half, second half] to interleaved pairs; put them back."""
    dim = weights.shape[0] // heads // 2
    w = weights.reshape(heads, dim, 2, *weights.shape[1:])
    return w.transpose(2, 1).reshape(weights.shape)


@dataclass(frozen=True, slots=True)
class GGUFEntry:
    """One tensor of the checkpoint under its Hugging Face name."""

    name: str
    tensor: TensorInfo
    part: Path
    """The file that holds it."""
    permuted_heads: int | None
    """The head count llama.cpp permuted its rows by (q and k of the Llama family)."""


class GGUFCheckpoint:
    """One GGUF checkpoint (all its parts), opened and checked; metadata is read lazily."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.parts = split_files(self.path)
        self.headers = [read_header(part) for part in self.parts]
        self.metadata = self.headers[0].metadata
        self.arch = self.string("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise CheckpointError(
                f"GGUF architecture {self.arch!r} is not supported "
                f"(supported: {', '.join(ARCHITECTURES)})",
                self.path,
            )
        self._check_tensors()

    def has(self, key: str) -> bool:
        return key in self.metadata

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value (a string, a number, a bool or a list of them) or ``default``."""
        return self.metadata.get(key, default)

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
        return {t.name for header in self.headers for t in header.tensors}

    def _check_tensors(self) -> None:
        for part, header in zip(self.parts, self.headers, strict=True):
            size = part.stat().st_size
            for tensor in header.tensors:
                if tensor.tensor_type not in SUPPORTED_TYPES:
                    kind = getattr(tensor.tensor_type, "name", str(tensor.tensor_type))
                    raise CheckpointError(
                        f"{part.name}: tensor {tensor.name} has type {kind}, not supported "
                        f"(supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))})",
                        part,
                    )
                block = GGML_QUANT_SIZES[tensor.tensor_type][0]
                if tensor.dims and tensor.dims[0] % block:
                    raise CheckpointError(
                        f"{part.name}: tensor {tensor.name}'s rows ({tensor.dims}) are not "
                        f"whole {tensor.tensor_type.name} blocks of {block}",
                        part,
                    )
                if tensor.offset + tensor.n_bytes > size:
                    raise CheckpointError(
                        f"{part.name} is truncated: tensor {tensor.name} needs bytes up to "
                        f"{tensor.offset + tensor.n_bytes}, the file has {size}",
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
            vocab = self._tensor("token_embd.weight").shape[0]
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

    def _tensor(self, name: str) -> TensorInfo:
        for header in self.headers:
            for tensor in header.tensors:
                if tensor.name == name:
                    return tensor
        raise CheckpointError(f"{self.path.name} has no tensor {name}", self.path)

    def entries(self) -> list[GGUFEntry]:
        """Every tensor under its Hugging Face name, in file order; one the decoder has no
        place for is a ``CheckpointError`` naming it."""
        heads = self.require(f"{self.arch}.attention.head_count")
        kv_heads = self.get(f"{self.arch}.attention.head_count_kv") or heads
        entries = []
        for part, header in zip(self.parts, self.headers, strict=True):
            for tensor in header.tensors:
                name = hf_tensor_name(tensor.name)
                if name is None:
                    raise CheckpointError(f"unexpected tensor {tensor.name!r} in {part.name}", part)
                permuted = None
                if self.arch in PERMUTED and name.endswith(("q_proj.weight", "q_proj.bias")):
                    permuted = heads
                elif self.arch in PERMUTED and name.endswith(("k_proj.weight", "k_proj.bias")):
                    permuted = kv_heads
                entries.append(GGUFEntry(name, tensor, part, permuted))
        return entries

    def read_into(self, entry: GGUFEntry, dst: torch.Tensor) -> None:
        """Fill ``dst`` (the entry's shape, contiguous; any dtype and device) with its values,
        a slab of rows at a time; a permuted q/k (a few MiB) whole, to undo the permutation."""
        if tuple(dst.shape) != entry.tensor.shape:
            raise CheckpointError(
                f"{entry.name} in {entry.part.name}: expected shape {tuple(dst.shape)}, "
                f"got {entry.tensor.shape}",
                entry.part,
            )
        if entry.permuted_heads is not None:
            with torch.no_grad():
                dst.copy_(self.read(entry))
            return
        with open(entry.part, "rb", buffering=0) as file:
            fill_tensor(file, entry.tensor, dst, entry.part)

    def read(self, entry: GGUFEntry) -> torch.Tensor:
        """The entry's values as a new float32 CPU tensor, q/k rows un-permuted."""
        with open(entry.part, "rb", buffering=0) as file:
            values = read_tensor(file, entry.tensor, entry.part)
        if entry.permuted_heads is not None:
            values = _unpermute(values, entry.permuted_heads)
        return values


@lru_cache(maxsize=2)
def open_checkpoint(path: Path) -> GGUFCheckpoint:
    """The checkpoint at ``path``, opened once per process (its metadata serves the config,
    the tokenizer and the chat template)."""
    return GGUFCheckpoint(path)
