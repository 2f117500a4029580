"""Random-weight checkpoints in Hugging Face Llama format, and the embedded default model.

No machine here can download weights, so ``servedeck init-model`` writes a deterministic
checkpoint (``config.json``, ``generation_config.json``, safetensors, ``tokenizer.json``,
``tokenizer_config.json`` with a simple chat template) that both this engine and
``transformers`` load.

Random weights give nearly tied logits under the usual 0.02 initialisation, and greedy
equality against another implementation would then hinge on float32 rounding. The scales
below make attention sharp and the residual stream large, so top-2 logit margins sit far
above float32 noise and every output token depends on the context.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from engine.corpus import corpus_lines

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
DEFAULT_PRESET = "small"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""What ``init_model`` writes as ``tokenizer_config.json``'s ``chat_template``: each turn
``<|role|>``, a newline, its text and EOS; the prompt ends with ``<|assistant|>`` and a newline
(so the default model chats through ``/v1/chat/completions``)."""


@dataclass(frozen=True, slots=True)
class Preset:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tokenizer_vocab: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = True
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def num_parameters(self) -> int:
        d, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        per_layer = d * (2 * d + 2 * kv) + 3 * d * self.intermediate_size + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_hidden_layers * per_layer + d + head


PRESETS: dict[str, Preset] = {
    "tiny": Preset(256, 512, 4, 4, 2, 4096, 4096, 4096),
    "small": Preset(512, 1792, 8, 8, 4, 8192, 8192, 4096),
    "llama3-8b": Preset(
        4096,
        14336,
        32,
        32,
        8,
        8192,
        128256,
        8192,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        dtype="bfloat16",
    ),
}


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on the shipped corpus; BOS is prepended like Llama 3's."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """BOS's and EOS's ids in a tokenizer ``build_tokenizer`` made (it trains both in)."""
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    if bos_id is None or eos_id is None:
        raise ValueError(f"the tokenizer lacks {BOS} or {EOS}")
    return bos_id, eos_id


def hf_config(preset: Preset, bos_id: int, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": preset.vocab_size,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_attention_heads": preset.num_attention_heads,
        "num_key_value_heads": preset.num_key_value_heads,
        "head_dim": preset.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": preset.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": preset.rope_theta,
        "rope_scaling": preset.rope_scaling,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": preset.dtype,
        "use_cache": True,
    }


def random_weights(
    preset: Preset, seed: int, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors, one at a time (so an 8B model never sits in memory twice)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    d, inter = preset.hidden_size, preset.intermediate_size
    q_out = preset.num_attention_heads * preset.head_dim
    kv_out = preset.num_key_value_heads * preset.head_dim

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        t = torch.empty(rows, cols, device=device, dtype=torch.float32)
        return t.normal_(0.0, std, generator=generator).to(dtype)

    yield "model.embed_tokens.weight", normal(preset.vocab_size, d, 1.0)
    for i in range(preset.num_hidden_layers):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", torch.ones(d, dtype=dtype, device=device)
        yield f"{p}.post_attention_layernorm.weight", torch.ones(d, dtype=dtype, device=device)
        yield f"{p}.self_attn.q_proj.weight", normal(q_out, d, 2.0 / math.sqrt(d))
        yield f"{p}.self_attn.k_proj.weight", normal(kv_out, d, 2.0 / math.sqrt(d))
        yield f"{p}.self_attn.v_proj.weight", normal(kv_out, d, 1.0 / math.sqrt(d))
        yield f"{p}.self_attn.o_proj.weight", normal(d, q_out, 4.0 / math.sqrt(q_out))
        yield f"{p}.mlp.gate_proj.weight", normal(inter, d, 1.0 / math.sqrt(d))
        yield f"{p}.mlp.up_proj.weight", normal(inter, d, 1.0 / math.sqrt(d))
        yield f"{p}.mlp.down_proj.weight", normal(d, inter, 4.0 / math.sqrt(inter))
    yield "model.norm.weight", torch.ones(d, dtype=dtype, device=device)
    if not preset.tie_word_embeddings:
        yield "lm_head.weight", normal(preset.vocab_size, d, 1.0)


def init_model(
    out_dir: str | Path,
    preset: str | Preset = DEFAULT_PRESET,
    seed: int = 0,
    max_shard_bytes: int = 2 << 30,
) -> Path:
    """Write a checkpoint of a named preset (or of a ``Preset`` of one's own: the load-memory
    benchmark's); more than ``max_shard_bytes`` of weights become a sharded index."""
    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset] if isinstance(preset, str) else preset
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.tokenizer_vocab)
    bos_id, eos_id = special_ids(tokenizer)
    dtype = getattr(torch, spec.dtype)
    _write_shards(out, random_weights(spec, seed, dtype), max_shard_bytes)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "config.json", hf_config(spec, bos_id, eos_id))
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False},
    )
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "model_max_length": spec.max_position_embeddings,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    return out


def _write_shards(out: Path, tensors: Iterator[tuple[str, torch.Tensor]], limit: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _write_json(out / "model.safetensors.index.json", index)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def cache_dir() -> Path:
    """``$SERVEDECK_HOME`` or ``$XDG_CACHE_HOME/servedeck`` (``~/.cache/servedeck``)."""
    if home := os.environ.get("SERVEDECK_HOME"):
        return Path(home)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servedeck"


def default_model_dir(preset: str = DEFAULT_PRESET, seed: int = 0) -> Path:
    """The embedded default checkpoint, created on first use."""
    path = cache_dir() / "models" / f"{preset}-seed{seed}"
    if (path / "config.json").is_file():
        _add_chat_template(path)
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    init_model(tmp, preset, seed)
    try:
        tmp.replace(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    return path


def _add_chat_template(path: Path) -> None:
    """A default model cached before ``init_model`` wrote a chat template gets it added to its
    ``tokenizer_config.json`` (in place, atomically), so it chats without being rebuilt."""
    config_path = path / "tokenizer_config.json"
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    if "chat_template" in config or (path / "chat_template.jinja").is_file():
        return
    config["chat_template"] = CHAT_TEMPLATE
    tmp = config_path.with_name(f"{config_path.name}.tmp{os.getpid()}")
    _write_json(tmp, config)
    tmp.replace(config_path)
