"""From an EngineConfig to a loaded model, a sized KV pool and a runner.

Loading the weights (``load_bundle``) and building a runner around them (``build_runner``)
are separate, so one loaded model can serve several engines (the benchmark gives every run a
fresh engine and KV pool around the same weights). ``load_bundle`` can also build a
checkpoint preset's model from seeded random weights made on the device, with no file read or
written (``RandomWeights``): the GPU check runs a llama3-8b-shaped engine that way.

With ``tensor_parallel_size`` K > 1, ``load_bundle`` is rank 0: it spawns ranks 1..K-1
(``engine.parallel.world``), which load their own shards while it loads its own, and the
bundle keeps their handle (``ModelBundle.parallel``; ``close`` stops them); ``build_runner``
has every rank build a KV pool for its KV heads with rank 0's number of blocks, and gives the
runner the hook that broadcasts each step.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from engine.checkpoint import BOS, EOS, PRESETS, build_tokenizer, hf_config
from engine.checkpoint import random_weights as preset_weights
from engine.config import CPU_KV_CACHE_BYTES, EngineConfig, EngineLimits
from engine.errors import CheckpointError
from engine.gguf_tokenizer import gguf_tokenizer
from engine.host_memory import retain_freed_memory
from engine.kv_cache import allocate_kv_cache, kv_bytes_per_block
from engine.model.config import ModelConfig
from engine.model.formats import is_gguf
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import build_model, load_model
from engine.parallel.shard import SINGLE, Shard, check_divisible
from engine.parallel.world import TensorParallelWorld
from engine.runner import ModelRunner
from engine.sampler import Sampler
from kernels.attention import resolve_backend

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelBundle:
    """Weights, tokenizer and stop tokens of one checkpoint, loaded once."""

    model: LlamaForCausalLM
    tokenizer: Tokenizer | None
    eos_token_ids: tuple[int, ...]
    parallel: TensorParallelWorld | None = None
    """Rank 0's handle on the other tensor-parallel ranks (None: one rank)."""

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (idempotent)."""
        if self.parallel is not None:
            self.parallel.close()


def load_tokenizer(path: Path) -> Tokenizer | None:
    """``tokenizer.json`` of a folder, or the tokenizer a GGUF file describes."""
    if is_gguf(path):
        return gguf_tokenizer(path).tokenizer
    file = path / "tokenizer.json"
    return Tokenizer.from_file(str(file)) if file.is_file() else None


def eos_token_ids(path: Path, model_config: ModelConfig) -> tuple[int, ...]:
    """``generation_config.json`` wins over ``config.json``, as in transformers (a GGUF file:
    its EOS and EOT ids, in the model config)."""
    file = path / "generation_config.json"
    if file.is_file():
        eos = json.loads(file.read_text()).get("eos_token_id")
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (eos,)
    return model_config.eos_token_ids


@dataclass(frozen=True, slots=True)
class RandomWeights:
    """A checkpoint preset (``engine.checkpoint.PRESETS``) built with seeded random weights.

    The weights are made tensor by tensor on the engine's device, so no file is read or
    written and an 8B-shaped model never exists twice. They are deterministic for a seed on one
    device type; on the CPU they equal the checkpoint ``servedeck init-model DIR --preset P
    --seed S`` writes (same draws, same dtype), and the tokenizer is the same one, built in
    memory."""

    preset: str
    seed: int = 0

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            choices = ", ".join(PRESETS)
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {choices}")


def load_bundle(
    config: EngineConfig, random_weights: RandomWeights | None = None, shard: Shard | None = None
) -> ModelBundle:
    """Load the checkpoint folder ``config.model``; with ``random_weights``, build that preset
    instead (``config.model`` is then only a label) in ``config.dtype`` on ``config.device``.

    ``tensor_parallel_size`` > 1 and no ``shard`` (rank 0): start the other ranks and load
    rank 0's shard; a size that does not divide the model's heads is refused (``ValueError``
    naming the field) before any process starts. ``shard``: a worker rank loading its own."""
    device = torch.device(config.device)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    if config.retain_freed_host_memory and device.type == "cpu":
        retain_freed_memory()
    dtype = getattr(torch, config.dtype)
    parallel = None
    if shard is None and config.tensor_parallel_size > 1:
        check_divisible(_model_config(config, random_weights), config.tensor_parallel_size)
        parallel = TensorParallelWorld(config, random_weights)
        shard = parallel.shard
    try:
        bundle = _load(config, random_weights, dtype, device, shard or SINGLE)
        if parallel is not None:
            parallel.join(config.device)
    except BaseException:
        if parallel is not None:
            parallel.close()
        raise
    bundle.parallel = parallel
    return bundle


def _load(
    config: EngineConfig,
    random_weights: RandomWeights | None,
    dtype: torch.dtype,
    device: torch.device,
    shard: Shard,
) -> ModelBundle:
    if random_weights is not None:
        return _random_bundle(random_weights, dtype, device, shard)
    path = Path(config.model)
    model = load_model(path, dtype, device, shard)
    tokenizer_path = Path(config.tokenizer) if config.tokenizer else path
    tokenizer_file = tokenizer_path / "tokenizer.json"
    if config.tokenizer and not is_gguf(tokenizer_path) and not tokenizer_file.is_file():
        raise CheckpointError(f"no tokenizer.json in {tokenizer_path}", tokenizer_path)
    return ModelBundle(model, load_tokenizer(tokenizer_path), eos_token_ids(path, model.config))


def _model_config(config: EngineConfig, random_weights: RandomWeights | None) -> ModelConfig:
    if random_weights is None:
        return ModelConfig.from_dir(config.model)
    return ModelConfig.from_dict(hf_config(PRESETS[random_weights.preset], 0, 0))


def _random_bundle(
    spec: RandomWeights, dtype: torch.dtype, device: torch.device, shard: Shard = SINGLE
) -> ModelBundle:
    preset = PRESETS[spec.preset]
    tokenizer = build_tokenizer(preset.tokenizer_vocab)
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    model_config = ModelConfig.from_dict(hf_config(preset, bos, eos))
    # Drawn in the preset's dtype, as init-model stores them, then cast like a loaded file.
    tensors = preset_weights(preset, spec.seed, getattr(torch, preset.dtype), device)
    model = build_model(model_config, tensors, dtype, device, shard)
    return ModelBundle(model, tokenizer, model_config.eos_token_ids)


def build_runner(bundle: ModelBundle, config: EngineConfig) -> tuple[ModelRunner, EngineLimits]:
    """A fresh KV pool and runner around loaded weights, and the limits they give."""
    device = torch.device(config.device)
    dtype = getattr(torch, config.dtype)
    mc = bundle.config
    kv_heads = bundle.model.shard.part(mc.num_key_value_heads)
    per_block = kv_bytes_per_block(
        mc.num_hidden_layers, config.block_size, kv_heads, mc.head_dim, dtype
    )
    num_blocks = config.num_kv_blocks or _default_num_blocks(config, device, per_block)
    max_model_len = config.max_model_len or mc.max_position_embeddings
    if max_model_len > mc.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's "
            f"max_position_embeddings={mc.max_position_embeddings}"
        )
    kv_caches = allocate_kv_cache(
        mc.num_hidden_layers,
        num_blocks,
        config.block_size,
        kv_heads,
        mc.head_dim,
        dtype,
        device,
    )
    runner = ModelRunner(
        bundle.model,
        kv_caches,
        config.block_size,
        resolve_backend(config.attention_backend, device),
        Sampler(torch.Generator(device=device).manual_seed(config.seed)),
    )
    if bundle.parallel is not None:
        bundle.parallel.build_runner(replace(config, num_kv_blocks=num_blocks))
        runner.broadcast = bundle.parallel.broadcast_step
    log.info(
        "KV pool: %d blocks of %d tokens (%.1f MiB)",
        num_blocks,
        config.block_size,
        num_blocks * per_block / 2**20,
    )
    limits = EngineLimits(
        block_size=config.block_size,
        num_kv_blocks=num_blocks,
        max_model_len=min(max_model_len, num_blocks * config.block_size),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    return runner, limits


def _default_num_blocks(config: EngineConfig, device: torch.device, per_block: int) -> int:
    """CPU: a bounded budget. CUDA: what is left of the memory share after the weights,
    minus room for the activations of the largest step."""
    if device.type != "cuda":
        return max(1, CPU_KV_CACHE_BYTES // per_block)
    free, total = torch.cuda.mem_get_info(device)
    usable = free - (1 - config.gpu_memory_utilization) * total
    activations = config.max_num_batched_tokens * 64 * 1024
    return max(1, int((usable - activations) // per_block))
