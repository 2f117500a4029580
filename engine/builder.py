"""From an EngineConfig to a loaded model, a sized KV pool and a runner."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from engine.config import CPU_KV_CACHE_BYTES, EngineConfig
from engine.kv_cache import allocate_kv_cache, kv_bytes_per_block
from engine.model.config import ModelConfig
from engine.model.loader import load_model
from engine.runner import ModelRunner
from engine.sampler import Sampler
from kernels.attention import resolve_backend

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    runner: ModelRunner
    tokenizer: Tokenizer | None
    model_config: ModelConfig
    eos_token_ids: tuple[int, ...]
    num_kv_blocks: int
    max_model_len: int


def load_tokenizer(path: Path) -> Tokenizer | None:
    file = path / "tokenizer.json"
    return Tokenizer.from_file(str(file)) if file.is_file() else None


def eos_token_ids(path: Path, model_config: ModelConfig) -> tuple[int, ...]:
    """``generation_config.json`` wins over ``config.json``, as in transformers."""
    file = path / "generation_config.json"
    if file.is_file():
        eos = json.loads(file.read_text()).get("eos_token_id")
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (eos,)
    return model_config.eos_token_ids


def load(config: EngineConfig) -> LoadedModel:
    path = Path(config.model)
    device = torch.device(config.device)
    dtype = getattr(torch, config.dtype)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    model = load_model(path, dtype, device)
    mc = model.config
    per_block = kv_bytes_per_block(
        mc.num_hidden_layers, config.block_size, mc.num_key_value_heads, mc.head_dim, dtype
    )
    num_blocks = config.num_kv_blocks or _default_num_blocks(config, device, per_block)
    capacity = num_blocks * config.block_size
    max_model_len = config.max_model_len or mc.max_position_embeddings
    if max_model_len > mc.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's "
            f"max_position_embeddings={mc.max_position_embeddings}"
        )
    max_model_len = min(max_model_len, capacity)
    kv_caches = allocate_kv_cache(
        mc.num_hidden_layers,
        num_blocks,
        config.block_size,
        mc.num_key_value_heads,
        mc.head_dim,
        dtype,
        device,
    )
    generator = torch.Generator(device=device).manual_seed(config.seed)
    runner = ModelRunner(
        model,
        kv_caches,
        config.block_size,
        resolve_backend(config.attention_backend, device),
        Sampler(generator),
    )
    log.info(
        "KV pool: %d blocks of %d tokens (%.1f MiB)",
        num_blocks,
        config.block_size,
        num_blocks * per_block / 2**20,
    )
    return LoadedModel(
        runner=runner,
        tokenizer=load_tokenizer(path),
        model_config=mc,
        eos_token_ids=eos_token_ids(path, mc),
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
    )


def _default_num_blocks(config: EngineConfig, device: torch.device, per_block: int) -> int:
    """CPU: a bounded budget. CUDA: what is left of the memory share after the weights,
    minus room for the activations of the largest step."""
    if device.type != "cuda":
        return max(1, CPU_KV_CACHE_BYTES // per_block)
    free, total = torch.cuda.mem_get_info(device)
    usable = free - (1 - config.gpu_memory_utilization) * total
    activations = config.max_num_batched_tokens * 64 * 1024
    return max(1, int((usable - activations) // per_block))
