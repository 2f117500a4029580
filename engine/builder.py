"""From an EngineConfig to a loaded model, a sized KV pool and a runner.

Loading the weights (``load_bundle``) and building a runner around them (``build_runner``)
are separate, so one loaded model can serve several engines (the benchmark gives every run a
fresh engine and KV pool around the same weights). ``load_bundle`` can also build a
checkpoint preset's model from seeded random weights made on the device, with no file read or
written (``RandomWeights``, engine/checkpoint_parts.py): the GPU check runs a llama3-8b-shaped
engine that way. The tokenizer and stop tokens come from engine/checkpoint_parts.py, as the
front's do.

With ``tensor_parallel_size`` K > 1, ``load_bundle`` is rank 0: it spawns ranks 1..K-1
(``engine.parallel.world``), which load their own shards while it loads its own, and the
bundle keeps their handle (``ModelBundle.parallel``; ``close`` stops them); ``build_runner``
has every rank build a KV pool for its KV heads with rank 0's number of blocks, and gives the
runner the hook that broadcasts each step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from tokenizers import Tokenizer

from engine.checkpoint import PRESETS, hf_config
from engine.checkpoint import random_weights as preset_weights
from engine.checkpoint_parts import (
    RandomWeights,
    checkpoint_tokenizer,
    eos_token_ids,
    preset_parts,
)
from engine.config import EngineConfig, EngineLimits
from engine.cpu import ComputeChoice, cpu_features, warn_if_slow
from engine.host_memory import retain_freed_memory
from engine.kv_budget import kv_limits
from engine.kv_pool import allocate_kv_cache, kv_bytes_per_block
from engine.model.config import ModelConfig
from engine.model.formats import read_model_config
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import build_model, load_model
from engine.model.products import plan_products
from engine.parallel.shard import SINGLE, Shard, check_divisible
from engine.parallel.world import TensorParallelWorld
from engine.runner import ModelRunner
from engine.sampler import Sampler
from kernels import native
from kernels.registry import resolve_backend

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


def load_bundle(
    config: EngineConfig, random_weights: RandomWeights | None = None, shard: Shard | None = None
) -> ModelBundle:
    """Load the checkpoint folder ``config.model``; with ``random_weights``, build that preset
    instead (``config.model`` is then only a label) in ``config.weights_dtype`` on
    ``config.device``.

    ``tensor_parallel_size`` > 1 and no ``shard`` (rank 0): start the other ranks and load
    rank 0's shard; a size that does not divide the model's heads is refused (``ValueError``
    naming the field) before any process starts. ``shard``: a worker rank loading its own."""
    device = torch.device(config.device)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    if shard is None:
        warn_if_slow(config.dtype_choice)
    dtype = getattr(torch, config.weights_dtype)
    parallel = None
    if shard is None and config.tensor_parallel_size > 1:
        check_divisible(_model_config(config, random_weights), config.tensor_parallel_size)
        parallel = TensorParallelWorld(config, partial(load_rank, random_weights))
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
    plan = plan_products(dtype, device, config.packed_products)
    bundle.model.prepare_products(plan)
    if shard is None:
        log.info(
            "weight products: %s (%s); packed copies %.1f MiB",
            plan.kind,
            plan.reason,
            bundle.model.packed_bytes / 2**20,
        )
    if config.retain_freed_host_memory and device.type == "cpu":
        # After the load: with freed blocks kept, the load's transients (each tensor's bytes,
        # a GGUF tensor dequantized) would stay resident beside the weights allocated before.
        retain_freed_memory()
    return bundle


def load_rank(
    random_weights: RandomWeights | None, config: EngineConfig, shard: Shard
) -> Callable[[EngineConfig], ModelRunner]:
    """A worker rank's load (``engine.parallel.worker.RankLoader``, with ``random_weights``
    bound): its shard's bundle, and what builds its runner for the pool rank 0 sized."""
    bundle = load_bundle(config, random_weights, shard=shard)
    return lambda runner_config: build_runner(bundle, runner_config)[0]


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
    return ModelBundle(model, checkpoint_tokenizer(config), eos_token_ids(path, model.config))


def _model_config(config: EngineConfig, random_weights: RandomWeights | None) -> ModelConfig:
    if random_weights is None:
        return read_model_config(config.model)
    return ModelConfig.from_dict(hf_config(PRESETS[random_weights.preset], 0, 0))


def _random_bundle(
    spec: RandomWeights, dtype: torch.dtype, device: torch.device, shard: Shard = SINGLE
) -> ModelBundle:
    preset = PRESETS[spec.preset]
    model_config, tokenizer, _ = preset_parts(spec.preset)
    # Drawn in the preset's dtype, as init-model stores them, then cast like a loaded file.
    tensors = preset_weights(preset, spec.seed, getattr(torch, preset.dtype), device)
    model = build_model(model_config, tensors, dtype, device, shard)
    return ModelBundle(model, tokenizer, model_config.eos_token_ids)


def build_runner(bundle: ModelBundle, config: EngineConfig) -> tuple[ModelRunner, EngineLimits]:
    """A fresh KV pool and runner around loaded weights, and the limits they give."""
    device = torch.device(config.device)
    dtype = getattr(torch, config.weights_dtype)
    mc = bundle.config
    kv_heads = bundle.model.shard.part(mc.num_key_value_heads)
    limits = kv_limits(config, mc, bundle.model.shard)
    num_blocks = limits.num_kv_blocks
    kv_caches = allocate_kv_cache(
        mc.num_hidden_layers,
        num_blocks,
        config.block_size,
        kv_heads,
        mc.head_dim,
        dtype,
        device,
    )
    backend = resolve_backend(config.attention_backend, device)
    use_native = config.native_attention and backend == "torch" and device.type == "cpu"
    kernels = native.load() if use_native else None
    runner = ModelRunner(
        bundle.model,
        kv_caches,
        config.block_size,
        backend,
        Sampler(torch.Generator(device=device).manual_seed(config.seed)),
        native=kernels,
        compute=_compute_choice(config, backend, use_native, kernels),
    )
    if bundle.parallel is not None:
        bundle.parallel.build_runner(replace(config, num_kv_blocks=num_blocks))
        runner.broadcast = bundle.parallel.broadcast_step
    log.info(
        "KV pool: %d blocks of %d tokens (%.1f MiB)",
        num_blocks,
        config.block_size,
        num_blocks
        * kv_bytes_per_block(mc.num_hidden_layers, config.block_size, kv_heads, mc.head_dim, dtype)
        / 2**20,
    )
    return runner, limits


def _compute_choice(
    config: EngineConfig, backend: str, use_native: bool, kernels: native.NativeKernels | None
) -> ComputeChoice:
    """The dtype and the decode attention in force, each with its reason."""
    choice = config.dtype_choice
    if kernels is not None:
        attention, why = "native", f"servedeck's paged decode kernel ({kernels.library.name})"
    elif use_native:
        attention, why = "torch", "the native kernel cannot be built here (the log says why)"
    elif backend != "torch":
        attention, why = backend, f"the {backend} backend"
    elif config.device != "cpu":
        attention, why = "torch", f"the native kernel is CPU-only (device {config.device})"
    else:
        attention, why = "torch", "--no-native-attention"
    cpu = cpu_features().summary if config.device == "cpu" else config.device
    return ComputeChoice(cpu, choice.dtype, choice.reason, attention, why)
